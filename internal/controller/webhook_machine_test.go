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
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/localport"
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
	port, err := localport.Free(nil)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// An attacker in a namespace with a quota tries to get around it: by
// placing Machines by hand (spec.nodeName set at create, which skips the
// scheduler and its checks) and by stopping a Machine, filling the room it
// left, and starting it again.
func TestMachineWebhookCannotBeBypassed(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	node := createNode(t, env, ns, "a", 64, "64Gi")
	ctx := context.Background()
	q := &kaironv1.MachineQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec:       kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](2), CPU: ptr.To[int32](4)}},
	}
	if err := env.Client.Create(ctx, q); err != nil {
		t.Fatal(err)
	}

	srv := startWebhookControllers(t, env, ns, Options{})
	srv.register(t, env, ns, MachineWebhookPath,
		[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, "machines")

	byHand := func(name string, cpu int32) *kaironv1.Machine {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		m.Spec.NodeName = node.Name
		m.Spec.CPU = cpu
		m.Spec.Memory = resource.MustParse("256Mi")
		return m
	}
	// Wait for the webhook: until the API server calls it, a Machine over
	// the cpu limit gets through (and is deleted again).
	eventually(t, "the webhook to refuse a Machine placed by hand over the cpu quota", func() (bool, string) {
		err := env.Client.Create(ctx, byHand("probe", 8))
		if err == nil {
			_ = env.Client.Delete(ctx, byHand("probe", 8))
			return false, "created"
		}
		return strings.Contains(err.Error(), `exceeds MachineQuota "team": cpu 0/4 used (needs 8)`), err.Error()
	})

	if err := env.Client.Create(ctx, byHand("placed", 2)); err != nil {
		t.Fatalf("Machine placed by hand within quota refused: %v", err)
	}
	// The Machine placed by hand is charged: 2 of 4 vCPUs are used now.
	err := env.Client.Create(ctx, byHand("greedy", 4))
	want := `exceeds MachineQuota "team": cpu 2/4 used (needs 4)`
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("second Machine placed by hand over the cpu quota: got %v, want Forbidden with %q", err, want)
	}
	if err := env.Client.Create(ctx, byHand("second", 2)); err != nil {
		t.Fatalf("Machine placed by hand within quota refused: %v", err)
	}
	err = env.Client.Create(ctx, byHand("third", 1))
	want = `exceeds MachineQuota "team": machines 2/2 used, cpu 4/4 used (needs 1)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("third Machine placed by hand: got %v, want %q", err, want)
	}

	// Stop "placed": once its agent reports it Stopped it is not charged,
	// and the room it left is taken by another Machine.
	// The controllers write to a Machine placed by hand too (its
	// conditions, their finalizers): each write is retried on a conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		placed := getMachine(t, env, ns, "placed")
		placed.Spec.PowerState = kaironv1.PowerStateStopped
		return env.Client.Update(ctx, placed)
	})
	if err != nil {
		t.Fatalf("stopping placed: %v", err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		placed := getMachine(t, env, ns, "placed")
		placed.Status.Phase = kaironv1.MachineStopped
		return env.Client.Status().Update(ctx, placed)
	})
	if err != nil {
		t.Fatalf("reporting placed Stopped: %v", err)
	}
	if err := env.Client.Create(ctx, byHand("filler", 2)); err != nil {
		t.Fatalf("Machine in the room a Stopped Machine left refused: %v", err)
	}

	// Starting it again is admitting it again, and the quota is full.
	start := func() error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m := getMachine(t, env, ns, "placed")
			m.Spec.PowerState = kaironv1.PowerStateRunning
			return env.Client.Update(ctx, m)
		})
	}
	err = start()
	want = `exceeds MachineQuota "team": machines 2/2 used, cpu 4/4 used (needs 2)`
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("restart over quota: got %v, want Forbidden with %q", err, want)
	}
	if m := getMachine(t, env, ns, "placed"); m.Spec.PowerState != kaironv1.PowerStateStopped {
		t.Fatalf("refused restart changed powerState to %q", m.Spec.PowerState)
	}

	// With room again, the restart goes through, and other updates of a
	// running Machine are not charged again.
	if err := env.Client.Delete(ctx, byHand("filler", 2)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restart to be admitted once filler is gone", func() (bool, string) {
		if err := start(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		second := getMachine(t, env, ns, "second")
		second.Labels = map[string]string{"touched": "yes"}
		return env.Client.Update(ctx, second)
	})
	if err != nil {
		t.Errorf("relabeling a running Machine with the quota full: %v", err)
	}
}
