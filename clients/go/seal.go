// Sealed content (docs/wire.md, "Sealing, exactly"): a run's data and token keys, their record in
// the key-value bucket LEDGER_KEYS wrapped under the local master key, and sealed values and texts.
package main

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

const (
	Alg        = "A256GCM"
	KeyBucket  = "LEDGER_KEYS"
	wrapAAD    = "runledger.run-keys.v2:"
	nonceBytes = 12
)

// MasterKey is the local master key: 32 bytes kept outside NATS.
type MasterKey struct {
	key []byte
	ID  string
}

func NewMasterKey(key []byte) (*MasterKey, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("the master key has %d bytes, not 32", len(key))
	}
	sum := sha256.Sum256(append([]byte("runledger master key id\x00"), key...))
	return &MasterKey{key: key, ID: "local:" + hex.EncodeToString(sum[:])[:16]}, nil
}

// MasterKeyFromText reads base64 (standard or URL-safe alphabet, blanks around it ignored).
func MasterKeyFromText(text string) (*MasterKey, error) {
	cleaned := strings.NewReplacer("-", "+", "_", "/").Replace(strings.TrimSpace(text))
	key, err := base64.StdEncoding.DecodeString(cleaned)
	if err != nil {
		return nil, fmt.Errorf("the master key is not base64 of 32 bytes: %w", err)
	}
	return NewMasterKey(key)
}

// MasterKeyFromEnv: $RUNLEDGER_MASTER_KEY, else the file $RUNLEDGER_MASTER_KEY_FILE, else <home>/master.key.
func MasterKeyFromEnv() (*MasterKey, error) {
	if text := os.Getenv("RUNLEDGER_MASTER_KEY"); text != "" {
		return MasterKeyFromText(text)
	}
	if path := os.Getenv("RUNLEDGER_MASTER_KEY_FILE"); path != "" {
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return MasterKeyFromText(string(text))
	}
	home := os.Getenv("RUNLEDGER_HOME")
	if home == "" {
		user, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		home = filepath.Join(user, ".runledger")
	}
	text, err := os.ReadFile(filepath.Join(home, "master.key"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errors.New("no master key: set $RUNLEDGER_MASTER_KEY (base64 of 32 bytes) or " +
			"$RUNLEDGER_MASTER_KEY_FILE, or run `runledger up`, which makes " + filepath.Join(home, "master.key"))
	}
	if err != nil {
		return nil, err
	}
	return MasterKeyFromText(string(text))
}

func gcm(key []byte) cipher.AEAD {
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

func randomNonce() []byte {
	nonce := make([]byte, nonceBytes)
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return nonce
}

// RunKeys are one run's data key (seals content) and token key (redaction tokens), under its kid.
type RunKeys struct {
	Kid      string
	DataKey  []byte
	TokenKey []byte
}

func NewRunKeys(kid string) *RunKeys {
	data, tokens := make([]byte, 32), make([]byte, 32)
	if _, err := rand.Read(data); err != nil {
		panic(err)
	}
	if _, err := rand.Read(tokens); err != nil {
		panic(err)
	}
	return &RunKeys{kid, data, tokens}
}

// DigestKeyInfo is the HKDF info of a run's digest key (docs/wire.md, "Digests of content").
const DigestKeyInfo = "runledger digest key"

// DigestKey is the key of the run's keyed digests (digest scheme 2): HKDF-SHA256-Expand of the data key
// with info DigestKeyInfo, 32 bytes, which is HMAC-SHA256(data key, info || 0x01).
func (k *RunKeys) DigestKey() []byte {
	mac := hmac.New(sha256.New, k.DataKey)
	mac.Write(append([]byte(DigestKeyInfo), 1))
	return mac.Sum(nil)
}

// KeyedDigest is the lowercase hex HMAC-SHA256, under the digest key, of v's canonical JSON: the
// args_digest (and approval digest) of a run that records digest_scheme 2 in run.started.
func (k *RunKeys) KeyedDigest(v any) string {
	mac := hmac.New(sha256.New, k.DigestKey())
	mac.Write(MustCanonical(v))
	return hex.EncodeToString(mac.Sum(nil))
}

// RunKid is the key id of a run an agent writes.
func RunKid(agent, runID string) string { return agent + "." + runID }

// SealBytes: nonce || AES-256-GCM(data key, nonce, plaintext, associated data = the kid).
func (k *RunKeys) SealBytes(plaintext, nonce []byte) []byte {
	return gcm(k.DataKey).Seal(append([]byte{}, nonce...), nonce, plaintext, []byte(k.Kid))
}

func (k *RunKeys) OpenBytes(sealed []byte) ([]byte, error) {
	if len(sealed) < nonceBytes {
		return nil, errors.New("sealed bytes too short")
	}
	return gcm(k.DataKey).Open(nil, sealed[:nonceBytes], sealed[nonceBytes:], []byte(k.Kid))
}

// SealValue is a content value as recorded sealed: {"$enc": "A256GCM", "kid": ..., "ct": base64}.
func (k *RunKeys) SealValue(value any, nonce []byte) map[string]any {
	if nonce == nil {
		nonce = randomNonce()
	}
	ct := base64.StdEncoding.EncodeToString(k.SealBytes(MustCanonical(value), nonce))
	return map[string]any{"$enc": Alg, "kid": k.Kid, "ct": ct}
}

// SealText is a string field (error message, traceback) as recorded sealed.
func (k *RunKeys) SealText(text string, nonce []byte) string {
	if nonce == nil {
		nonce = randomNonce()
	}
	return "«sealed:" + Alg + ":" + k.Kid + ":" + base64.StdEncoding.EncodeToString(k.SealBytes([]byte(text), nonce)) + "»"
}

// Record is the key-value record of the keys (format v2), byte for byte as runledger writes it.
func (k *RunKeys) Record(master *MasterKey, nonce []byte) []byte {
	if nonce == nil {
		nonce = randomNonce()
	}
	secret := append(append([]byte{}, k.DataKey...), k.TokenKey...)
	wrapped := gcm(master.key).Seal(append([]byte{}, nonce...), nonce, secret, []byte(wrapAAD+k.Kid))
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return []byte(`{"alg": "` + Alg + `", "kid": ` + quote(k.Kid) + `, "mk": ` + quote(master.ID) +
		`, "v": 2, "wrapped": "` + base64.StdEncoding.EncodeToString(wrapped) + `"}`)
}

// UnwrapRecord reads a key record of format v2 (or v1, in the clear) stored under kid.
func UnwrapRecord(kid string, data []byte, master *MasterKey) (*RunKeys, error) {
	var record struct {
		V        int    `json:"v"`
		Kid      string `json:"kid"`
		Mk       string `json:"mk"`
		Wrapped  string `json:"wrapped"`
		DataKey  string `json:"data_key"`
		TokenKey string `json:"token_key"`
	}
	if err := json.Unmarshal(data, &record); err != nil {
		return nil, fmt.Errorf("the key record of %s is corrupt: %w", kid, err)
	}
	if record.Kid != kid {
		return nil, fmt.Errorf("the key record stored under %s is the record of %s", kid, record.Kid)
	}
	if record.V == 0 || record.V == 1 {
		dataKey, err1 := base64.StdEncoding.DecodeString(record.DataKey)
		tokenKey, err2 := base64.StdEncoding.DecodeString(record.TokenKey)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("the key record of %s is corrupt", kid)
		}
		return &RunKeys{kid, dataKey, tokenKey}, nil
	}
	if record.V != 2 {
		return nil, fmt.Errorf("the key record of %s has format %d; this writer reads 1 and 2", kid, record.V)
	}
	if record.Mk != master.ID {
		return nil, fmt.Errorf("the keys of %s are wrapped under master key %s, this one is %s", kid, record.Mk, master.ID)
	}
	wrapped, err := base64.StdEncoding.DecodeString(record.Wrapped)
	if err != nil || len(wrapped) < nonceBytes {
		return nil, fmt.Errorf("the key record of %s is corrupt", kid)
	}
	secret, err := gcm(master.key).Open(nil, wrapped[:nonceBytes], wrapped[nonceBytes:], []byte(wrapAAD+kid))
	if err != nil || len(secret) != 64 {
		return nil, fmt.Errorf("the wrapped keys of %s fail authentication under %s", kid, master.ID)
	}
	return &RunKeys{kid, secret[:32], secret[32:]}, nil
}

// CreateRunKeys stores new keys for kid unless the bucket holds keys under it already (then those
// are returned): a publish to $KV.LEDGER_KEYS.<kid> fenced on "the key was never written". A key
// erased (its last entry a delete or purge marker) is never written again.
func (p *Publisher) CreateRunKeys(kid string, master *MasterKey) (*RunKeys, error) {
	keys := NewRunKeys(kid)
	subject := "$KV." + KeyBucket + "." + kid
	msg := nats.NewMsg(subject)
	msg.Data = keys.Record(master, nil)
	msg.Header.Set(FenceHeader, "0")
	_, err := p.js.PublishMsg(msg)
	if err == nil {
		return keys, nil
	}
	if apiCode(err) != WrongLastSeq {
		return nil, fmt.Errorf("cannot create the keys of %s: %w", kid, err)
	}
	last, err := p.js.GetLastMsg("KV_"+KeyBucket, subject)
	if err != nil {
		return nil, fmt.Errorf("cannot read the keys of %s: %w", kid, err)
	}
	if op := last.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, fmt.Errorf("the keys of %s were destroyed (the run was erased, stream seq %s)", kid, strconv.FormatUint(last.Sequence, 10))
	}
	return UnwrapRecord(kid, last.Data, master)
}
