// A writer of the runledger wire format in Go, written from docs/wire.md and tests/vectors alone.
//
//	runledger-go --check-vectors ../../tests/vectors
//	    replays the test vectors: canonical JSON, hashes and the chain, subjects, headers, msg ids,
//	    envelopes byte for byte, the key record and sealed values; prints {"checked", "skipped", "failures"}
//	runledger-go --server nats://127.0.0.1:4222 --agent go-agent --run-id RUN --key refund:order-1 [--stop-after claim]
//	    writes a run whose content is sealed (RUNLEDGER_MASTER_KEY) and whose digests are keyed under its
//	    digest key (digest scheme 2): run.started, a model call, a tool
//	    call, an effect with its claim on the key, the outcome, run.completed; prints a JSON summary.
//	    --stop-after claim stops after the intent and the claim, as a crash would: the effect in doubt.
//	    A key committed already is not acted on: its outcome is copied to the run and its result opened.
//	    Exits 3 when the key is claimed without an outcome (in doubt, or held by another run).
//	runledger-go --hold
//	    prints {"holder": ...}, this process as it names itself in claims, and lives until its stdin closes.
//
// It imports nothing of runledger: every rule is the page's.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// Holder names this process as docs/wire.md says: <host>/<pid namespace>/<pid>/<start time>; "" without /proc.
func Holder() string {
	host, err1 := os.Hostname()
	namespace, err2 := os.Readlink("/proc/self/ns/pid")
	pid := os.Getpid()
	stat, err3 := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err1 != nil || err2 != nil || err3 != nil {
		return ""
	}
	text := string(stat)
	// Field 22 (starttime), counted after the command name, which may hold spaces and parentheses.
	fields := strings.Fields(text[strings.LastIndex(text, ")")+2:])
	if len(fields) <= 19 {
		return ""
	}
	return fmt.Sprintf("%s/%s/%d/%s", host, namespace, pid, fields[19])
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

var (
	lookupSchema = map[string]any{"type": "object", "properties": map[string]any{"order": map[string]any{"type": "string"}}}
	refundSchema = map[string]any{"type": "object", "properties": map[string]any{
		"order": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"}}}
)

// ToolSchemaHash is a tool's entry in tool_schema_hashes (a plain tool's class is "read").
func ToolSchemaHash(name, effectClass string, schema map[string]any) string {
	return Digest(map[string]any{"name": name, "effect_class": effectClass, "schema": schema})
}

type runOptions struct {
	server, agent, runID, key, stopAfter string
	lease                                float64
}

func writeRun(o runOptions) (map[string]any, int, error) {
	master, err := MasterKeyFromEnv()
	if err != nil {
		return nil, 1, err
	}
	pub, err := Connect(o.server)
	if err != nil {
		return nil, 1, err
	}
	defer pub.nc.Drain()
	if nats.Version != "1.22.1" {
		return nil, 1, fmt.Errorf("built with nats.go %s, not the pinned 1.22.1", nats.Version)
	}
	keys, err := pub.CreateRunKeys(RunKid(o.agent, o.runID), master)
	if err != nil {
		return nil, 1, err
	}
	holder := nullable(Holder())
	run := &Chain{pub: pub, Subject: RunSubject(o.agent, o.runID, "a"), RunID: o.runID, Agent: o.agent,
		MsgID: func(s int) string { return RunMsgID(o.runID, s) }, PrevHash: Genesis}
	order := o.key[strings.LastIndex(o.key, ":")+1:]
	prompt := "You issue refunds."
	seal := func(v any) map[string]any { return keys.SealValue(v, nil) }

	if _, _, err := run.Append("run.started", map[string]any{
		"agent": o.agent,
		"version": map[string]any{
			"agent_version": "go-writer-1", "model": "scripted-go", "prompt_hash": sha256Hex([]byte(prompt)),
			"tool_schema_hashes": map[string]any{
				"lookup_order": ToolSchemaHash("lookup_order", "read", lookupSchema),
				"refund":       ToolSchemaHash("refund", "irreversible", refundSchema),
			},
		},
		"budgets": map[string]any{"turns": nil, "tokens": nil, "seconds": nil},
		"input":   seal(map[string]any{"order": order, "amount": 12.5}),
		"capture": "full", "labels": map[string]any{"client": "go"}, "chain_format": 2, "holder": holder,
		// Its content is sealed, so its digests are keyed: erasing the run leaves none anyone can test a guess against.
		"digest_scheme": 2,
	}); err != nil {
		return nil, 1, err
	}
	request := map[string]any{
		"messages": []any{map[string]any{"role": "user", "content": "refund " + order}},
		"params":   map[string]any{"temperature": 0},
	}
	if _, _, err := run.Append("model.called", map[string]any{
		"step": 0, "model": "scripted-go", "request": seal(request), "args_digest": keys.KeyedDigest(request),
		"response": seal(map[string]any{"content": "refunding " + order, "tool_calls": []any{}, "finish_reason": "stop"}),
		"error":    nil, "usage": map[string]any{"input_tokens": 9, "output_tokens": 2}, "duration_ms": 1.5,
		"attempt": 1, "will_retry": false,
	}); err != nil {
		return nil, 1, err
	}
	lookup := map[string]any{"order": order}
	if _, _, err := run.Append("tool.called", map[string]any{
		"step": 1, "name": "lookup_order", "args": seal(lookup), "args_digest": keys.KeyedDigest(lookup),
		"output": seal(map[string]any{"order": order, "amount": 12.5, "currency": "EUR"}), "error": nil,
		"duration_ms": 0.25, "attempt": 1, "will_retry": false,
	}); err != nil {
		return nil, 1, err
	}
	// The effect: intent on the run, claim on the key (the same payload, sealed once: the same
	// ciphertext on both), fenced on "the key is empty"; act; outcome on the key (fenced on the
	// claim); outcome on the run.
	args := map[string]any{"order": order, "amount": 12.5}
	intent := map[string]any{
		"step": 2, "name": "refund", "key": o.key, "args": seal(args), "args_digest": keys.KeyedDigest(args),
		"effect_class": "irreversible", "lease_s": o.lease, "tool_call_id": nil, "holder": holder,
	}
	if _, _, err := run.Append("effect.intended", intent); err != nil {
		return nil, 1, err
	}
	key := &Chain{pub: pub, Subject: KeySubject(o.agent, o.key, "a"), RunID: o.runID, Agent: o.agent,
		MsgID: func(s int) string { return KeyMsgID(o.agent, o.key, s) }, PrevHash: Genesis}
	_, token, err := key.Append("effect.intended", intent)
	var fenced *FencedError
	if errors.As(err, &fenced) {
		// The key has a history: read it and settle it.
		state, err := pub.ReadKey(o.agent, o.key)
		if err != nil {
			return nil, 1, err
		}
		state = state.AgentView()
		switch state.Status {
		case "committed":
			return copyOutcome(pub, master, run, o, state, seal)
		case "free", "failed": // never claimed by the agent, failed, or released: a new attempt, fenced on the key as read
			key.Seq, key.PrevHash, key.LastStreamSeq = state.NextSeq, state.LastHash, state.LastStreamSeq
			_, token, err = key.Append("effect.intended", intent)
		default: // claimed without an outcome: in doubt, or held by another run. Never guessed.
			return map[string]any{"run_id": o.runID, "claimed": false, "settled": state.Status,
				"held_by": state.RunID}, 3, nil
		}
	}
	if errors.As(err, &fenced) {
		return map[string]any{"run_id": o.runID, "claimed": false}, 3, nil
	}
	if err != nil {
		return nil, 1, err
	}
	summary := map[string]any{
		"run_id": o.runID, "claimed": true, "acted": true, "subject": run.Subject, "key_subject": key.Subject,
		"kid": keys.Kid, "fencing_token": token, "holder": holder,
	}
	if o.stopAfter == "claim" {
		summary["events"], summary["last_hash"] = run.Seq, run.PrevHash
		return summary, 0, nil
	}
	result := map[string]any{"refund_id": "rf-go-" + strconv.FormatUint(token, 10), "amount": 12.5}
	committed := map[string]any{"step": 2, "key": o.key, "result": seal(result), "duration_ms": 2,
		"via": "act", "fencing_token": token}
	_, onKey, err := key.Append("effect.committed", committed)
	if err != nil {
		return nil, 1, err
	}
	// The run's last two events in one atomic batch, fenced as a whole on the run.
	last, err := run.AppendBatch([]BatchEvent{
		{"effect.committed", committed},
		{"run.completed", map[string]any{"output": seal(map[string]any{"refunded": 12.5})}},
	})
	if err != nil {
		return nil, 1, err
	}
	summary["key_last_stream_seq"], summary["run_last_stream_seq"] = onKey, last
	summary["events"], summary["last_hash"], summary["result"] = run.Seq, run.PrevHash, result
	return summary, 0, nil
}

// copyOutcome finishes a run whose effect's key was committed already: the key's outcome copied
// to the run (via "record"), its result opened (sealed by whichever run committed it), no act.
func copyOutcome(pub *Publisher, master *MasterKey, run *Chain, o runOptions, state *KeyState,
	seal func(any) map[string]any) (map[string]any, int, error) {
	via := "record"
	if state.Via == "reconcile" {
		via = "reconcile"
	}
	result, err := pub.Open(state.Result, master)
	if err != nil {
		return nil, 1, err
	}
	if _, _, err := run.Append("effect.committed", map[string]any{"step": 2, "key": o.key, "result": state.Result,
		"via": via}); err != nil {
		return nil, 1, err
	}
	if _, _, err := run.Append("run.completed", map[string]any{"output": seal(map[string]any{"refunded": 12.5})}); err != nil {
		return nil, 1, err
	}
	return map[string]any{"run_id": o.runID, "claimed": false, "settled": "committed", "acted": false,
		"committed_by": state.RunID, "result": result, "events": run.Seq, "last_hash": run.PrevHash}, 0, nil
}

func main() {
	vectors := flag.String("check-vectors", "", "a tests/vectors directory to replay")
	var o runOptions
	flag.StringVar(&o.server, "server", "", "NATS URL")
	flag.StringVar(&o.agent, "agent", "", "agent name")
	flag.StringVar(&o.runID, "run-id", "", "run id (default: a new ULID)")
	flag.StringVar(&o.key, "key", "", "the effect's idempotency key")
	flag.StringVar(&o.stopAfter, "stop-after", "", `"claim": stop after the intent and the claim`)
	flag.Float64Var(&o.lease, "lease", 300, "the claim's lease in seconds")
	hold := flag.Bool("hold", false, "print this process's holder name and live until stdin closes")
	flag.Parse()
	if *hold {
		text, _ := json.Marshal(map[string]any{"holder": Holder()})
		fmt.Println(string(text))
		_, _ = io.Copy(io.Discard, os.Stdin)
		return
	}
	out, code := any(nil), 0
	if *vectors != "" {
		report, err := CheckVectors(*vectors)
		if err != nil {
			fmt.Fprintln(os.Stderr, "runledger-go:", err)
			os.Exit(1)
		}
		if len(report.Failures) > 0 {
			code = 1
		}
		out = report
	} else {
		if o.server == "" || o.agent == "" || o.key == "" {
			fmt.Fprintln(os.Stderr, "runledger-go: --server, --agent and --key are required (or --check-vectors DIR)")
			os.Exit(2)
		}
		if o.runID == "" {
			o.runID = ULID()
		}
		summary, status, err := writeRun(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "runledger-go:", err)
			os.Exit(status)
		}
		out, code = summary, status
	}
	text, _ := json.Marshal(out)
	fmt.Println(string(text))
	os.Exit(code)
}
