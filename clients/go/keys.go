// Reading an idempotency key's history and settling it (docs/wire.md, "The claim protocol for
// effects" and "What a reader must refuse"), and opening content sealed by another run.
package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// KeyState is a key folded: free, claimed (in doubt), committed or failed.
type KeyState struct {
	Status        string
	RunID         string
	Step          any
	Result        any
	Via           string
	Writer        string // the latest claim's writer token
	NextSeq       int
	LastHash      string
	LastStreamSeq uint64
}

// ReadKey reads every message of the key (all writers) in stream order and folds them. Events a
// writer may not write are stepped over (they still move the fence).
func (p *Publisher) ReadKey(agent, key string) (*KeyState, error) {
	filter := "ledger.effect." + agent + "." + KeyToken(key) + ".*"
	st := &KeyState{Status: "free", LastHash: Genesis}
	sub, err := p.js.SubscribeSync(filter, nats.OrderedConsumer(), nats.DeliverAll())
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	for {
		msg, err := sub.NextMsg(5 * time.Second)
		if errors.Is(err, nats.ErrTimeout) && st.LastStreamSeq == 0 {
			return st, nil // never written
		}
		if err != nil {
			return nil, err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return nil, err
		}
		parsed, err := ParseJSON(msg.Data)
		if err != nil {
			return nil, fmt.Errorf("%s stream seq %d is not JSON: %w", msg.Subject, meta.Sequence.Stream, err)
		}
		st.apply(msg.Subject, parsed.(map[string]any), meta.Sequence.Stream)
		if meta.NumPending == 0 {
			return st, nil
		}
	}
}

func (st *KeyState) apply(subject string, ev map[string]any, streamSeq uint64) {
	st.LastStreamSeq = streamSeq
	seq, _ := ev["seq"].(interface{ Int64() (int64, error) })
	if seq != nil {
		n, _ := seq.Int64()
		st.NextSeq = int(n) + 1
	}
	st.LastHash, _ = ev["hash"].(string)
	writer := subject[strings.LastIndex(subject, ".")+1:]
	typ, _ := ev["type"].(string)
	payload, _ := ev["payload"].(map[string]any)
	runID, _ := ev["run_id"].(string)
	ownClaim := st.Status == "claimed" && writer == st.Writer && runID == st.RunID
	switch {
	case writer == "o" && typ != "effect.resolved":
	case typ == "effect.intended" && writer != "o":
		if writer == "w" && (st.Status == "claimed" || st.Status == "committed") {
			return // a worker claims only a free key
		}
		st.Status, st.RunID, st.Step, st.Result, st.Via, st.Writer = "claimed", runID, payload["step"], nil, "", writer
	case typ == "effect.committed" && ownClaim:
		st.Status, st.Result, st.Via = "committed", payload["result"], fmt.Sprint(payload["via"])
	case typ == "effect.failed" && ownClaim:
		st.Status = "failed"
	case typ == "effect.resolved" && (writer == "o" || (ownClaim && payload["by"] == "reconcile")):
		if payload["outcome"] == "committed" {
			st.Status, st.Result, st.Via = "committed", payload["result"], fmt.Sprint(payload["by"])
		} else {
			st.Status = "free"
		}
	}
}

// AgentView: a key only a worker's branch claimed is free to the agent, which never takes a worker's word.
func (st *KeyState) AgentView() *KeyState {
	if st.Writer != "w" {
		return st
	}
	view := *st
	view.Status, view.RunID, view.Step, view.Result, view.Via = "free", "", nil, nil, ""
	return &view
}

// Open returns content as the agent receives it: a sealed value opened with the keys of the kid it
// names (read from LEDGER_KEYS and unwrapped), anything else as it is.
func (p *Publisher) Open(value any, master *MasterKey) (any, error) {
	sealed, ok := value.(map[string]any)
	if !ok || sealed["$enc"] != Alg {
		return value, nil
	}
	kid, _ := sealed["kid"].(string)
	entry, err := p.js.GetLastMsg("KV_"+KeyBucket, "$KV."+KeyBucket+"."+kid)
	if err != nil {
		return nil, fmt.Errorf("the keys of %s cannot be read (erased, or not this role's): %w", kid, err)
	}
	if op := entry.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, fmt.Errorf("the keys of %s were destroyed (the run was erased)", kid)
	}
	keys, err := UnwrapRecord(kid, entry.Data, master)
	if err != nil {
		return nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(fmt.Sprint(sealed["ct"]))
	if err != nil {
		return nil, err
	}
	plaintext, err := keys.OpenBytes(raw)
	if err != nil {
		return nil, fmt.Errorf("content sealed under %s fails authentication (altered?)", kid)
	}
	return ParseJSON(plaintext)
}
