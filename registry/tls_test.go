package registry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/browsergrid/caddy-browser-grid/internal/testenv"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key.
func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

// rediss:// with a password reaches a TLS-only port and the registry works
// through it.
func TestNewClientTLS(t *testing.T) {
	ctx := context.Background()
	cert, key := writeCert(t, t.TempDir())
	srv := testenv.StartRedis(t, "--requirepass", "s3cret", "--tls-port", testenv.PortArg,
		"--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no")
	tlsPort := srv.ExtraPorts[0]
	if err := testenv.WaitTCP("127.0.0.1:"+strconv.Itoa(tlsPort), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// The certificate is self-signed: skip_verify (go-redis' URL option).
	rdb, err := NewClient("rediss://:s3cret@127.0.0.1:" + strconv.Itoa(tlsPort) + "/0?skip_verify=true")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	r := New(rdb, Options{})
	register(t, r, "p", "w", 0)
	c := claim(t, r, ClaimRequest{Group: "p", Policy: Vnode, Options: VnodeOptions{Samples: 2, SlotJitter: 4}, Limits: Limits{MaxConcurrent: 1}})
	if _, err := r.EndServed(ctx, "p", c.Worker.ID, []Ended{{Session: c.Session}}); err != nil {
		t.Fatalf("end over TLS: %v", err)
	}
	// A plain-text client cannot talk to the TLS port.
	plain, err := NewClient("redis://:s3cret@127.0.0.1:" + strconv.Itoa(tlsPort) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx2, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if plain.Ping(ctx2).Err() == nil {
		t.Fatal("a plain-text client talked to the TLS port")
	}
}
