package registry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
)

// Signed registrations. With a shared secret, the agent's registration
// carries an HMAC-SHA256 over what a proxy dials (pool, ID, address,
// path) and the registration's generation, and the proxy dials only
// records whose signature verifies: a Redis writer without the secret can
// neither point a record at another address or path nor move a signature
// onto another worker's record. The secret itself is never stored.

// Errors of WorkerInfo.CheckSignature.
var (
	// ErrUnsigned: the record carries no signature.
	ErrUnsigned = errors.New("record is not signed")
	// ErrBadSignature: the record's signature does not verify with the
	// secret (forged, or made with another secret).
	ErrBadSignature = errors.New("record signature does not verify")
)

// signatureLabel separates this use of the secret from any other.
const signatureLabel = "browser-grid worker record v1"

// signRecord returns the hex HMAC-SHA256, keyed with secret, of the
// fields a proxy dials and the registration generation. Each field is
// length-prefixed, so no two different records share a message.
func signRecord(secret []byte, pool, id, addr, path, gen string) string {
	m := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, f := range []string{signatureLabel, pool, id, addr, path, gen} {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write([]byte(f))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// CheckSignature verifies the record's signature with secret, in constant
// time: nil when it verifies, ErrUnsigned or ErrBadSignature otherwise.
func (w WorkerInfo) CheckSignature(secret []byte) error {
	if w.sig == "" {
		return ErrUnsigned
	}
	want := signRecord(secret, w.Pool, w.ID, w.Addr, w.Path, w.gen)
	if !hmac.Equal([]byte(want), []byte(w.sig)) {
		return ErrBadSignature
	}
	return nil
}
