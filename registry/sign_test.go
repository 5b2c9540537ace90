package registry

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestSignedRecord: a registration with a secret stores a signature that
// verifies with that secret only, survives the scripts that rewrite the
// record (heartbeat, claim, undo with a suspect mark), and stops
// verifying once a Redis writer changes the address, the path or the
// generation, or moves the signature onto another worker's record.
func TestSignedRecord(t *testing.T) {
	r, rdb := startRegistry(t, Options{})
	ctx := context.Background()
	secret := []byte("s3cret")
	for _, id := range []string{"w1", "w2"} {
		err := r.Register(ctx, Registration{Pool: "chromium", ID: id, BrowserType: "chromium",
			Addr: "127.0.0.1:9" + id[1:], Path: "/playwright", TTL: time.Minute, Secret: secret})
		if err != nil {
			t.Fatal(err)
		}
	}
	register(t, r, "chromium", "plain", 0)
	check := func(id string, secret []byte) error {
		t.Helper()
		w, err := r.Worker(ctx, "chromium", id)
		if err != nil {
			t.Fatal(err)
		}
		return w.CheckSignature(secret)
	}
	if err := check("w1", secret); err != nil {
		t.Fatalf("signed record: %v", err)
	}
	if err := check("w1", []byte("other")); !errors.Is(err, ErrBadSignature) {
		t.Errorf("another secret: %v, want ErrBadSignature", err)
	}
	if err := check("plain", secret); !errors.Is(err, ErrUnsigned) {
		t.Errorf("unsigned record: %v, want ErrUnsigned", err)
	}

	// The scripts that rewrite the record keep the signature.
	if _, err := r.Heartbeat(ctx, "chromium", "w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := r.Claim(ctx, ClaimRequest{Pool: "chromium", Policy: LifetimeFirst, Holder: "t", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Worker.CheckSignature(secret); err != nil && c.Worker.ID != "plain" {
		t.Errorf("claimed worker %s: %v", c.Worker.ID, err)
	}
	if err := r.Undo(ctx, "chromium", c.LeaseID, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"w1", "w2"} {
		if err := check(id, secret); err != nil {
			t.Errorf("%s after heartbeat, claim and undo: %v", id, err)
		}
	}

	// A Redis writer edits the record.
	key := r.Key("chromium", keyWorkers)
	edit := func(id string, f func(m map[string]any)) {
		t.Helper()
		raw, err := rdb.HGet(ctx, key, id).Result()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		if err := rdb.HSet(ctx, key, id, b).Err(); err != nil {
			t.Fatal(err)
		}
	}
	w1, _ := rdb.HGet(ctx, key, "w1").Result()
	var orig map[string]any
	_ = json.Unmarshal([]byte(w1), &orig)
	for name, f := range map[string]func(m map[string]any){
		"addr": func(m map[string]any) { m["addr"] = "127.0.0.1:6379" },
		"path": func(m map[string]any) { m["path"] = "/internal/admin" },
		"gen":  func(m map[string]any) { m["gen"] = "other" },
		"sig":  func(m map[string]any) { m["sig"] = "00" + m["sig"].(string)[2:] },
	} {
		edit("w1", func(m map[string]any) {
			for k, v := range orig {
				m[k] = v
			}
			f(m)
		})
		if err := check("w1", secret); !errors.Is(err, ErrBadSignature) {
			t.Errorf("record with a changed %s: %v, want ErrBadSignature", name, err)
		}
	}
	// w2's signature moved onto w1 (same secret, another worker).
	w2, _ := r.Worker(ctx, "chromium", "w2")
	edit("w1", func(m map[string]any) {
		for k, v := range orig {
			m[k] = v
		}
		m["sig"] = w2.sig
		m["gen"] = w2.gen
		m["addr"] = w2.Addr
	})
	if err := check("w1", secret); !errors.Is(err, ErrBadSignature) {
		t.Errorf("w2's signature on w1's record: %v, want ErrBadSignature", err)
	}
}
