package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrClientLimit: the claim's client already holds its limit of live
// sessions in the pool (ClaimRequest.ClientLimit); nothing was claimed.
var ErrClientLimit = errors.New("client limit reached")

// ClientLimitError is returned (wrapping ErrClientLimit) when a claim's
// client is at its limit.
type ClientLimitError struct {
	// Live is how many live sessions the client holds in the pool, across
	// every process sharing the Redis; Limit is the request's limit.
	Live, Limit int
}

func (e *ClientLimitError) Error() string {
	return fmt.Sprintf("%s: %d live sessions of %d allowed for this client", ErrClientLimit, e.Live, e.Limit)
}

func (e *ClientLimitError) Unwrap() error { return ErrClientLimit }

// clientHashLen is how many hex digits of SHA-256 name a client in Redis
// (128 bits: collisions between clients are out of reach).
const clientHashLen = 32

// ClientHash is what Redis stores for a client key: the first 128 bits of
// its SHA-256, in hex. "" for an empty key (no client). A hash keeps raw
// keys (IP addresses, user names, tokens) out of Redis and out of logs; it
// does not hide a key that can be guessed (an IP address can be found by
// hashing all of them).
func ClientHash(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:clientHashLen]
}

// checkClientHash validates a client hash from a caller (LeaseRenewal):
// empty, or clientHashLen lowercase hex digits.
func checkClientHash(h string) error {
	if h == "" {
		return nil
	}
	if len(h) != clientHashLen {
		return fmt.Errorf("invalid client hash: %d characters, want %d", len(h), clientHashLen)
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("invalid client hash: %q is not a lowercase hex digit", c)
		}
	}
	return nil
}

// ClientSessions returns how many live sessions the client key holds in
// the pool (its lease_client entries; leases lapsed but not yet freed by a
// claim or the reaper still count).
func (r *Registry) ClientSessions(ctx context.Context, pool, key string) (int, error) {
	if err := checkPool(pool); err != nil {
		return 0, fmt.Errorf("counting a client's sessions: %w", err)
	}
	h := ClientHash(key)
	if h == "" {
		return 0, nil
	}
	n, err := r.rdb.ZLexCount(ctx, r.Key(pool, keyLeaseClient), "["+h+" ", "("+h+"!").Result()
	if err != nil {
		return 0, fmt.Errorf("counting a client's sessions in pool %q: %w", pool, err)
	}
	return int(n), nil
}

// Interface guards.
var _ error = (*ClientLimitError)(nil)
