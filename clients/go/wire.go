// Subjects, msg ids, envelopes, the hash chain and fenced publishing (docs/wire.md, "Streams and
// subjects" to "Errors a writer must expect").
package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	LedgerStream     = "LEDGER"
	Genesis          = "0000000000000000000000000000000000000000000000000000000000000000"
	FenceHeader      = "Nats-Expected-Last-Subject-Sequence"
	FenceSubject     = "Nats-Expected-Last-Subject-Sequence-Subject"
	MsgIDHeader      = "Nats-Msg-Id"
	BatchIDHeader    = "Nats-Batch-Id"
	BatchSeqHeader   = "Nats-Batch-Sequence"
	BatchCommit      = "Nats-Batch-Commit"
	WrongLastSeq     = 10071
	WrongLastPending = 10164 // a replicated stream's "not yet": retry with the same msg id
	DuplicateInBatch = 10201
)

var subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func token(what, value string) string {
	if !subjectToken.MatchString(value) {
		panic(fmt.Sprintf("%s %q: use 1-128 of A-Z a-z 0-9 _ -", what, value))
	}
	return value
}

func RunSubject(agent, runID, writer string) string {
	return "ledger.run." + token("agent", agent) + "." + token("run id", runID) + "." + writer
}

func KeySubject(agent, key, writer string) string {
	return "ledger.effect." + token("agent", agent) + "." + KeyToken(key) + "." + writer
}

// FenceFilter is what an append to subject is fenced on: the whole run or key (its writer token a wildcard).
func FenceFilter(subject string) string { return subject[:strings.LastIndex(subject, ".")] + ".*" }

// FenceFor is what an append expecting lastStreamSeq is fenced on: a run's first message claims its
// run id over every agent's subjects of it (ledger.run.*.<run_id>.*: a 10071 means another run holds
// the id, and nothing of the run may be done); every other append is fenced on FenceFilter's run or key.
func FenceFor(subject string, lastStreamSeq uint64) string {
	parts := strings.Split(subject, ".")
	if lastStreamSeq == 0 && len(parts) == 5 && parts[0] == "ledger" && parts[1] == "run" {
		return "ledger.run.*." + parts[3] + ".*"
	}
	return FenceFilter(subject)
}

func RunMsgID(runID string, seq int) string { return runID + ":" + strconv.Itoa(seq) }

// KeyMsgID is a key's own msg id: never <run_id>:<seq>, which the stream would take for the run's event.
func KeyMsgID(agent, key string, seq int) string {
	return "effect:" + agent + ":" + KeyToken(key) + ":" + strconv.Itoa(seq)
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// ULID: 48 bits of milliseconds and 80 random bits, 26 characters of Crockford base32.
func ULID() string {
	random := make([]byte, 10)
	if _, err := rand.Read(random); err != nil {
		panic(err)
	}
	value := new(big.Int).Lsh(big.NewInt(time.Now().UnixMilli()), 80)
	value.Or(value, new(big.Int).SetBytes(random))
	out := make([]byte, 26)
	thirtyOne := big.NewInt(31)
	for i := 25; i >= 0; i-- {
		out[i] = crockford[new(big.Int).And(value, thirtyOne).Int64()]
		value.Rsh(value, 5)
	}
	return string(out)
}

// UTCNow is RFC 3339 UTC with microseconds, as runledger writes ts.
func UTCNow() string { return time.Now().UTC().Format("2006-01-02T15:04:05.000000Z") }

// Envelope is one event: its ten members (hash included) and its wire bytes.
type Envelope struct {
	Fields map[string]any
	Hash   string
	Data   []byte
}

// MakeEvent builds the next event of a chain: hash = sha256(ASCII(prev_hash) || canonical(envelope without hash)).
func MakeEvent(id, runID, agent string, seq int, typ string, payload map[string]any, prevHash, ts string) Envelope {
	unhashed := map[string]any{
		"id": id, "run_id": runID, "agent": agent, "seq": seq, "type": typ, "schema_version": 1,
		"ts": ts, "payload": payload, "prev_hash": prevHash,
	}
	h := sha256.New()
	h.Write([]byte(prevHash))
	h.Write(MustCanonical(unhashed))
	hash := hex.EncodeToString(h.Sum(nil))
	unhashed["hash"] = hash
	return Envelope{Fields: unhashed, Hash: hash, Data: MustCanonical(unhashed)}
}

// FencedError: error 10071, something was appended since this writer last looked.
type FencedError struct{ Subject, Description string }

func (e *FencedError) Error() string { return "fenced on " + e.Subject + ": " + e.Description }

// Publisher publishes fenced events and watches the connection's asynchronous errors, where a
// permission violation is told (the publish itself only times out).
type Publisher struct {
	nc     *nats.Conn
	js     nats.JetStreamContext
	mu     sync.Mutex
	denied []string
}

func Connect(url string) (*Publisher, error) {
	p := &Publisher{}
	nc, err := nats.Connect(url, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.denied = append(p.denied, err.Error())
	}))
	if err != nil {
		return nil, err
	}
	js, err := nc.JetStream()
	if err != nil {
		return nil, err
	}
	p.nc, p.js = nc, js
	return p, nil
}

func (p *Publisher) deniedOn(subject string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, text := range p.denied {
		if strings.Contains(strings.ToLower(text), "permissions violation") && strings.Contains(text, subject) {
			return text
		}
	}
	return ""
}

func apiCode(err error) int {
	var api *nats.APIError
	if errors.As(err, &api) {
		return int(api.ErrorCode)
	}
	return 0
}

// Publish stores data on subject once, fenced on lastStreamSeq over FenceFor's subjects, and
// returns the stream sequence. Transient failures are retried with the same msg id and headers;
// a 10071 or a duplicate ack is believed only after the stored message was compared with ours.
func (p *Publisher) Publish(subject string, data []byte, msgID string, lastStreamSeq uint64) (uint64, error) {
	deadline := time.Now().Add(30 * time.Second)
	retried := false
	for {
		msg := nats.NewMsg(subject)
		msg.Data = data
		msg.Header.Set(MsgIDHeader, msgID)
		msg.Header.Set(FenceHeader, strconv.FormatUint(lastStreamSeq, 10))
		msg.Header.Set(FenceSubject, FenceFor(subject, lastStreamSeq))
		ack, err := p.js.PublishMsg(msg, nats.AckWait(5*time.Second))
		if err == nil {
			if !ack.Duplicate {
				return ack.Sequence, nil
			}
			if seq, ours := p.storedAs(subject, data, msgID); ours {
				return seq, nil
			}
			return 0, fmt.Errorf("%s: a duplicate ack for msg id %s whose stored bytes are not ours", subject, msgID)
		}
		code := apiCode(err)
		if code == WrongLastSeq {
			if seq, ours := p.storedAs(subject, data, msgID); retried && ours {
				return seq, nil // our own earlier publish, whose ack was lost
			}
			var api *nats.APIError
			errors.As(err, &api)
			return 0, &FencedError{subject, api.Description}
		}
		if denial := p.deniedOn(subject); denial != "" {
			return 0, fmt.Errorf("%s: %s", subject, denial)
		}
		transient := code == WrongLastPending || code == 10008 || code == 10009 || code == 10118 || code == 10158 ||
			errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrNoStreamResponse)
		if !transient || time.Now().After(deadline) {
			return 0, fmt.Errorf("%s: %w", subject, err)
		}
		retried = true
		time.Sleep(200 * time.Millisecond)
	}
}

// storedAs: the stream sequence of the subject's last message when it is ours (same msg id, same bytes).
func (p *Publisher) storedAs(subject string, data []byte, msgID string) (uint64, bool) {
	last, err := p.js.GetLastMsg(LedgerStream, subject)
	if err != nil || last.Header.Get(MsgIDHeader) != msgID || !bytes.Equal(last.Data, data) {
		return 0, false
	}
	return last.Sequence, true
}

// Chain is the single writer of one run or one key: seq, prev_hash and the fence of its next append.
type Chain struct {
	pub           *Publisher
	Subject       string
	RunID, Agent  string
	MsgID         func(seq int) string
	Seq           int
	PrevHash      string
	LastStreamSeq uint64
}

func (c *Chain) next(typ string, payload map[string]any) Envelope {
	return MakeEvent(ULID(), c.RunID, c.Agent, c.Seq, typ, payload, c.PrevHash, UTCNow())
}

func (c *Chain) advance(ev Envelope, streamSeq uint64) {
	c.Seq, c.PrevHash, c.LastStreamSeq = c.Seq+1, ev.Hash, streamSeq
}

// Append publishes the next event and waits for its ack.
func (c *Chain) Append(typ string, payload map[string]any) (Envelope, uint64, error) {
	ev := c.next(typ, payload)
	seq, err := c.pub.Publish(c.Subject, ev.Data, c.MsgID(c.Seq), c.LastStreamSeq)
	if err != nil {
		return ev, 0, err
	}
	c.advance(ev, seq)
	return ev, seq, nil
}

// BatchEvent is one event of an atomic batch, before it is numbered and chained.
type BatchEvent struct {
	Type    string
	Payload map[string]any
}

// AppendBatch stores events as one JetStream atomic batch (nats-server 2.12+, allow_atomic): every
// message carries the batch id, its sequence in the batch and its own msg id; the first also the
// fence; the last the commit header and a reply subject, whose answer is the ack of the whole batch.
func (c *Chain) AppendBatch(events []BatchEvent) (uint64, error) {
	batchID := ULID()
	built := make([]Envelope, 0, len(events))
	prev := c.PrevHash
	for i, e := range events {
		ev := MakeEvent(ULID(), c.RunID, c.Agent, c.Seq+i, e.Type, e.Payload, prev, UTCNow())
		built, prev = append(built, ev), ev.Hash
	}
	var reply *nats.Msg
	for i, ev := range built {
		msg := nats.NewMsg(c.Subject)
		msg.Data = ev.Data
		msg.Header.Set(BatchIDHeader, batchID)
		msg.Header.Set(BatchSeqHeader, strconv.Itoa(i+1))
		msg.Header.Set(MsgIDHeader, c.MsgID(c.Seq+i))
		if i == 0 {
			msg.Header.Set(FenceHeader, strconv.FormatUint(c.LastStreamSeq, 10))
			msg.Header.Set(FenceSubject, FenceFor(c.Subject, c.LastStreamSeq))
		}
		if i < len(built)-1 {
			if err := c.pub.nc.PublishMsg(msg); err != nil {
				return 0, err
			}
			continue
		}
		msg.Header.Set(BatchCommit, "1")
		var err error
		if reply, err = c.pub.nc.RequestMsg(msg, 5*time.Second); err != nil {
			return 0, fmt.Errorf("%s: atomic batch: %w", c.Subject, err)
		}
	}
	var answer struct {
		Seq   uint64         `json:"seq"`
		Count int            `json:"count"`
		Error *nats.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &answer); err != nil {
		return 0, fmt.Errorf("%s: atomic batch: unreadable answer %q", c.Subject, reply.Data)
	}
	if answer.Error != nil {
		if int(answer.Error.ErrorCode) == WrongLastSeq {
			return 0, &FencedError{c.Subject, answer.Error.Description}
		}
		return 0, fmt.Errorf("%s: atomic batch refused: %d %s", c.Subject, answer.Error.ErrorCode, answer.Error.Description)
	}
	if answer.Count != len(built) || answer.Seq == 0 {
		return 0, fmt.Errorf("%s: unexpected answer to an atomic batch: %s", c.Subject, reply.Data)
	}
	for i, ev := range built {
		c.advance(ev, answer.Seq-uint64(len(built)-1-i))
	}
	return answer.Seq, nil
}
