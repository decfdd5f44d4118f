// The test vectors (docs/wire.md, "Test vectors"): canonical JSON, complete runs as published, sealing.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

type VectorReport struct {
	Checked  int      `json:"checked"`
	Skipped  int      `json:"skipped"`
	Failures []string `json:"failures"`
}

func (r *VectorReport) fail(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

func readJSON(dir, name string, into any) error {
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

func CheckVectors(dir string) (*VectorReport, error) {
	report := &VectorReport{Failures: []string{}}
	for _, check := range []func(string, *VectorReport) error{checkCanonical, checkRuns, checkSealing, checkDigests} {
		if err := check(dir, report); err != nil {
			return nil, err
		}
	}
	return report, nil
}

func checkCanonical(dir string, r *VectorReport) error {
	var data struct {
		Cases []struct {
			Name, Ieee754, Input, Canonical, Sha256 string
		}
		Keys []struct {
			Key          string `json:"key"`
			SubjectToken string `json:"subject_token"`
		}
	}
	if err := readJSON(dir, "canonical.json", &data); err != nil {
		return err
	}
	for _, c := range data.Cases {
		var value any
		if c.Ieee754 != "" {
			raw, err := hex.DecodeString(c.Ieee754)
			if err != nil {
				return err
			}
			value = math.Float64frombits(binary.BigEndian.Uint64(raw))
		} else {
			parsed, err := ParseJSON([]byte(c.Input))
			if err != nil {
				r.fail("%s: %v", c.Name, err)
				continue
			}
			value = parsed
		}
		r.Checked++
		text, err := Canonical(value)
		switch {
		case err != nil:
			r.fail("%s: %v", c.Name, err)
		case string(text) != c.Canonical:
			r.fail("%s: %s != %s", c.Name, text, c.Canonical)
		case sha256Hex(text) != c.Sha256:
			r.fail("%s: sha256", c.Name)
		}
	}
	for _, k := range data.Keys {
		r.Checked++
		if KeyToken(k.Key) != k.SubjectToken {
			r.fail("key %q", k.Key)
		}
	}
	return nil
}

func checkRuns(dir string, r *VectorReport) error {
	var data struct {
		Messages []struct {
			StreamSeq uint64            `json:"stream_seq"`
			Subject   string            `json:"subject"`
			Headers   map[string]string `json:"headers"`
			Data      string            `json:"data"`
			Hash      string            `json:"hash"`
		}
	}
	if err := readJSON(dir, "runs.json", &data); err != nil {
		return err
	}
	type chain struct {
		seq  int
		prev string
		last uint64
	}
	chains := map[string]*chain{}
	for _, m := range data.Messages {
		r.Checked++
		parsed, err := ParseJSON([]byte(m.Data))
		if err != nil {
			r.fail("message %d: %v", m.StreamSeq, err)
			continue
		}
		event := parsed.(map[string]any)
		payload := event["payload"].(map[string]any)
		fence := FenceFilter(m.Subject)
		c, ok := chains[fence]
		if !ok {
			c = &chain{0, Genesis, 0}
			chains[fence] = c
		}
		agent, runID, writer := event["agent"].(string), event["run_id"].(string), m.Subject[len(m.Subject)-1:]
		ours := MakeEvent(event["id"].(string), runID, agent, c.seq, event["type"].(string), payload, c.prev, event["ts"].(string))
		isKey := strings.HasPrefix(m.Subject, "ledger.effect.")
		subject, msgID := RunSubject(agent, runID, writer), RunMsgID(runID, c.seq)
		if isKey {
			key := payload["key"].(string)
			subject, msgID = KeySubject(agent, key, writer), KeyMsgID(agent, key, c.seq)
		}
		problems := []string{}
		if string(ours.Data) != m.Data {
			problems = append(problems, "bytes")
		}
		if ours.Hash != m.Hash || event["hash"] != m.Hash || event["prev_hash"] != c.prev {
			problems = append(problems, "hash chain")
		}
		if subject != m.Subject {
			problems = append(problems, "subject "+subject)
		}
		if m.Headers[MsgIDHeader] != msgID {
			problems = append(problems, "msg id "+msgID)
		}
		if m.Headers[FenceHeader] != fmt.Sprint(c.last) || m.Headers[FenceSubject] != FenceFor(m.Subject, c.last) {
			problems = append(problems, "fence")
		}
		if args, has := payload["args"]; has && payload["args_digest"] != nil && Digest(args) != payload["args_digest"] {
			problems = append(problems, "args_digest")
		}
		if event["type"] == "model.called" && Digest(payload["request"]) != payload["args_digest"] {
			problems = append(problems, "model args_digest")
		}
		if len(problems) > 0 {
			r.fail("message %d: %s", m.StreamSeq, strings.Join(problems, ", "))
		}
		c.seq, c.prev, c.last = c.seq+1, m.Hash, m.StreamSeq
	}
	return nil
}

func checkSealing(dir string, r *VectorReport) error {
	var data struct {
		MasterKey   string `json:"master_key"`
		MasterKeyID string `json:"master_key_id"`
		Kid         string `json:"kid"`
		DataKey     string `json:"data_key"`
		TokenKey    string `json:"token_key"`
		WrapNonce   string `json:"wrap_nonce"`
		KeyRecord   string `json:"key_record"`
		Values      []struct {
			Name      string          `json:"name"`
			Value     json.RawMessage `json:"value"`
			Plaintext string          `json:"plaintext"`
			Nonce     string          `json:"nonce"`
			Sealed    map[string]any  `json:"sealed"`
		} `json:"values"`
		Texts []struct {
			Name, Text, Nonce, Sealed string
		} `json:"texts"`
	}
	if err := readJSON(dir, "sealing.json", &data); err != nil {
		return err
	}
	master, err := MasterKeyFromText(data.MasterKey)
	if err != nil {
		return err
	}
	r.Checked++
	if master.ID != data.MasterKeyID {
		r.fail("master key id %s != %s", master.ID, data.MasterKeyID)
	}
	r.Checked++
	keys, err := UnwrapRecord(data.Kid, []byte(data.KeyRecord), master)
	if err != nil {
		r.fail("key record: %v", err)
		return nil
	}
	if base64.StdEncoding.EncodeToString(keys.DataKey) != data.DataKey || base64.StdEncoding.EncodeToString(keys.TokenKey) != data.TokenKey {
		r.fail("key record: unwrapped keys")
	}
	nonce, _ := hex.DecodeString(data.WrapNonce)
	if string(keys.Record(master, nonce)) != data.KeyRecord {
		r.fail("key record: %s != %s", keys.Record(master, nonce), data.KeyRecord)
	}
	for _, c := range data.Values {
		r.Checked++
		value, err := ParseJSON(c.Value)
		if err != nil {
			return err
		}
		if string(MustCanonical(value)) != c.Plaintext {
			r.fail("%s: plaintext %s != %s", c.Name, MustCanonical(value), c.Plaintext)
		}
		nonce, _ := hex.DecodeString(c.Nonce)
		sealed := keys.SealValue(value, nonce)
		if sealed["ct"] != c.Sealed["ct"] || sealed["kid"] != c.Sealed["kid"] || c.Sealed["$enc"] != Alg || len(c.Sealed) != 3 {
			r.fail("%s: sealed %v != %v", c.Name, sealed, c.Sealed)
		}
		raw, _ := base64.StdEncoding.DecodeString(fmt.Sprint(c.Sealed["ct"]))
		if opened, err := keys.OpenBytes(raw); err != nil || string(opened) != c.Plaintext {
			r.fail("%s: opening gave %q (%v)", c.Name, opened, err)
		}
	}
	for _, c := range data.Texts {
		r.Checked++
		nonce, _ := hex.DecodeString(c.Nonce)
		if sealed := keys.SealText(c.Text, nonce); sealed != c.Sealed {
			r.fail("%s: sealed %s != %s", c.Name, sealed, c.Sealed)
		}
	}
	return nil
}

// checkDigests replays digests.json: the digest key derived from the data key, and each value's plain
// (scheme 1) and keyed (scheme 2) digest; hash-only content digested alike.
func checkDigests(dir string, r *VectorReport) error {
	var data struct {
		Kid           string `json:"kid"`
		DataKey       string `json:"data_key"`
		DigestKey     string `json:"digest_key"`
		DigestKeyInfo string `json:"digest_key_info"`
		Cases         []struct {
			Name      string          `json:"name"`
			Value     json.RawMessage `json:"value"`
			Canonical string          `json:"canonical"`
			Plain     string          `json:"plain"`
			Keyed     string          `json:"keyed"`
		} `json:"cases"`
		HashOnly struct {
			Value        json.RawMessage `json:"value"`
			Recorded     map[string]any  `json:"recorded"`
			Text         string          `json:"text"`
			RecordedText string          `json:"recorded_text"`
		} `json:"hash_only"`
	}
	if err := readJSON(dir, "digests.json", &data); err != nil {
		return err
	}
	dataKey, err := base64.StdEncoding.DecodeString(data.DataKey)
	if err != nil {
		return err
	}
	keys := &RunKeys{Kid: data.Kid, DataKey: dataKey}
	r.Checked++
	if data.DigestKeyInfo != DigestKeyInfo || base64.StdEncoding.EncodeToString(keys.DigestKey()) != data.DigestKey {
		r.fail("digest key %s != %s", base64.StdEncoding.EncodeToString(keys.DigestKey()), data.DigestKey)
	}
	for _, c := range data.Cases {
		r.Checked++
		value, err := ParseJSON(c.Value)
		if err != nil {
			return err
		}
		if string(MustCanonical(value)) != c.Canonical || Digest(value) != c.Plain || keys.KeyedDigest(value) != c.Keyed {
			r.fail("%s: digests %s, %s != %s, %s", c.Name, Digest(value), keys.KeyedDigest(value), c.Plain, c.Keyed)
		}
	}
	r.Checked++
	value, err := ParseJSON(data.HashOnly.Value)
	if err != nil {
		return err
	}
	if keys.KeyedDigest(value) != data.HashOnly.Recorded["$hash"] {
		r.fail("hash-only value: %s != %v", keys.KeyedDigest(value), data.HashOnly.Recorded["$hash"])
	}
	mac := hmac.New(sha256.New, keys.DigestKey())
	mac.Write([]byte(data.HashOnly.Text))
	if "«hash:"+hex.EncodeToString(mac.Sum(nil))+"»" != data.HashOnly.RecordedText {
		r.fail("hash-only text: %s", data.HashOnly.RecordedText)
	}
	return nil
}
