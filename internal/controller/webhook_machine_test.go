package controller

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
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// The real API server calls the webhook over TLS and refuses what it refuses,
// with its message.
func TestMachineWebhook(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	node := createNode(t, env, ns, "a", 16, "16Gi")
	createQuota(t, env, ns, 1)

	srv := startWebhookControllers(t, env, ns, Options{})
	srv.register(t, env, ns, MachineWebhookPath,
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "machines")

	ctx := context.Background()
	tryCreate := func(name string, mutate func(*kaironv1.Machine)) error {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		m.Spec.Memory = resource.MustParse("256Mi")
		if mutate != nil {
			mutate(m)
		}
		return env.Client.Create(ctx, m)
	}

	// The API server picks the configuration up a moment after it is
	// created; until then the probe is let through and deleted again.
	wantNodeRefusal := `spec.nodeName: Invalid value: "no-such-node": no Node named "no-such-node" exists; leave spec.nodeName empty to let the scheduler choose`
	eventually(t, "the webhook to refuse a Machine on a missing node", func() (bool, string) {
		err := tryCreate("probe", func(m *kaironv1.Machine) { m.Spec.NodeName = "no-such-node" })
		if err == nil {
			_ = env.Client.Delete(ctx, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}})
			return false, "created"
		}
		return strings.Contains(err.Error(), wantNodeRefusal), err.Error()
	})

	if err := tryCreate("first", nil); err != nil {
		t.Fatalf("first Machine within quota refused: %v", err)
	}
	err := tryCreate("second", nil)
	if err == nil {
		t.Fatal("second Machine over the quota of 1 was created")
	}
	// The first counts although it may not be placed yet.
	want := `admission webhook "machines.kairon.zyvor.dev" denied the request: machines.kairon.zyvor.dev "second" is forbidden: exceeds MachineQuota "team": machines 1/1 used`
	if err.Error() != want || !apierrors.IsForbidden(err) {
		t.Errorf("refusal:\n got %v\nwant %s", err, want)
	}

	// A Machine placed by hand on a node that exists is fine, and binding
	// (an update of spec.nodeName) goes through the webhook too.
	waitScheduled(t, env, ns, "first")
	if err := tryCreate("by-hand", func(m *kaironv1.Machine) {
		m.Spec.NodeName = node.Name
	}); err == nil || !strings.Contains(err.Error(), "machines 1/1 used") {
		t.Errorf("Machine placed by hand over quota: %v", err)
	}
}

// writeServingCert writes tls.crt and tls.key for 127.0.0.1, signed by a
// fresh CA, and returns their directory and the CA certificate.
func writeServingCert(t *testing.T) (dir string, caPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kairon webhook test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serving := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, serving, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	write := func(name, blockType string, der []byte) {
		data := pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der})
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.crt", "CERTIFICATE", der)
	write("tls.key", "EC PRIVATE KEY", keyDER)
	return dir, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
