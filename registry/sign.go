package registry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
)

// Signed records and claims. With a shared secret, the agent signs what a
// proxy dials (pool, ID, address, path), and Caddy dials only records
// whose signature verifies: a Redis writer without the secret can neither
// point a record at another address nor move a signature onto another
// worker's record, another pool or another Playwright version. Caddy
// signs each claim it sends to an agent the same way, so an agent with
// the secret serves only Caddy's sessions. The secret itself is never
// stored.

// Errors of Record.CheckSignature.
var (
	// ErrUnsigned: the record carries no signature.
	ErrUnsigned = errors.New("record is not signed")
	// ErrBadSignature: the signature does not verify with the secret.
	ErrBadSignature = errors.New("record signature does not verify")
)

// Sign returns the hex HMAC-SHA256, keyed with secret, of label and
// fields, each length-prefixed so that no two lists share a message.
func Sign(secret []byte, label string, fields ...string) string {
	m := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, f := range append([]string{label}, fields...) {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// SignatureOK compares a signature with the one expected, in constant time.
func SignatureOK(got, want string) bool { return hmac.Equal([]byte(got), []byte(want)) }

const recordLabel = "browser-grid worker record v1"

func (rec *Record) signature(secret []byte) string {
	return Sign(secret, recordLabel, rec.Pool, rec.Version, rec.ID, rec.Addr, rec.Path)
}

// CheckSignature verifies the record's signature with secret: nil, or
// ErrUnsigned or ErrBadSignature.
func (rec *Record) CheckSignature(secret []byte) error {
	if rec.Sig == "" {
		return ErrUnsigned
	}
	if !SignatureOK(rec.Sig, rec.signature(secret)) {
		return ErrBadSignature
	}
	return nil
}
