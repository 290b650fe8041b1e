package node_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// failingReceive is a sim backend that cannot load an incoming guest.
type failingReceive struct{ *sim.Backend }

func (failingReceive) ReceiveLive(_ context.Context, _ backend.Spec, r io.Reader) (backend.Instance, error) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 1)) // the stream started
	return backend.Instance{}, errors.New("injected receive failure")
}

// migrationCA is a CA for agents' live migration certificates.
type migrationCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

func newMigrationCA(t *testing.T, commonName string) *migrationCA {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	return &migrationCA{cert: caCert, key: caKey, der: caDER}
}

// leaf is a certificate the CA signed for commonName (also its DNS SAN).
func (ca *migrationCA) leaf(t *testing.T, commonName string) (certDER []byte, key *ecdsa.PrivateKey) {
	t.Helper()
	key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	leaf := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: commonName}, DNSNames: []string{commonName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// dir writes the CA and a certificate it signed for commonName, as the
// directory --migration-tls-dir names holds them (tls.crt, tls.key, ca.crt).
func (ca *migrationCA) dir(t *testing.T, commonName string) string {
	t.Helper()
	leafDER, key := ca.leaf(t, commonName)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: ca.der},
		"tls.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tlsClient is a client configuration presenting ca's certificate for
// commonName (none if empty), trusting any server.
func (ca *migrationCA) tlsClient(t *testing.T, commonName string) *tls.Config {
	t.Helper()
	config := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
	if commonName != "" {
		der, key := ca.leaf(t, commonName)
		config.Certificates = []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}
	}
	return config
}

func withTLS(dir string) func(*node.Options) {
	return func(o *node.Options) { o.MigrationTLSDir = dir }
}

// migrationMetric reads kairon_machinemigrations_total for the labels, and
// the number of downtimes kairon_machinemigration_downtime_seconds holds for
// strategy, from the registry the in-process controllers publish to.
func migrationMetric(t *testing.T, strategy, phase, reason string) (ended float64, downtimes uint64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	has := func(m *dto.Metric, want map[string]string) bool {
		n := 0
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				n++
			}
		}
		return n == len(want)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "kairon_machinemigrations_total":
				if has(m, map[string]string{"strategy": strategy, "phase": phase, "reason": reason}) {
					ended = m.GetCounter().GetValue()
				}
			case "kairon_machinemigration_downtime_seconds":
				if has(m, map[string]string{"strategy": strategy}) {
					downtimes = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return ended, downtimes
}

// waitEvent waits for an event with reason about the object kind/name whose
// note is note.
func waitEvent(t *testing.T, env *testenv.Env, ns, kind, name, reason, note string) {
	t.Helper()
	testenv.Eventually(t, waitTimeout, "a "+reason+" event on "+kind+" "+name, func() (bool, string) {
		var l eventsv1.EventList
		if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var notes []string
		for _, e := range l.Items {
			if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
				if e.Note == note {
					return true, ""
				}
				notes = append(notes, e.Note)
			}
		}
		return false, fmt.Sprintf("%d events, %s ones: %q", len(l.Items), reason, notes)
	})
}

// migrateLive creates the live migration "live" of machine and waits for
// it to reach want.
func migrateLive(t *testing.T, env *testenv.Env, ns, machine string, want kaironv1.MigrationPhase) *kaironv1.MachineMigration {
	t.Helper()
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "live"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: machine, Strategy: kaironv1.MigrationLive},
	}
	if err := env.Client.Create(context.Background(), mig); err != nil {
		t.Fatal(err)
	}
	return waitMigration(t, env, client.ObjectKeyFromObject(mig), want)
}

func instancePaused(t *testing.T, stateDir, ns, name string) bool {
	t.Helper()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances")})
	if err != nil {
		t.Fatal(err)
	}
	in, err := b.Get(context.Background(), ns+"_"+name)
	return err == nil && in.Phase == backend.Paused
}

// TestLiveMigrationMovesARunningMachine: two agents with their own migration
// certificates (one CA) move a Machine live; the migration records the downtime, and
// the Machine keeps its address (both nodes have the same range here, and
// the target would otherwise hand out its lowest free address).
func TestLiveMigrationMovesARunningMachine(t *testing.T) {
	ca := newMigrationCA(t, "kairon migration CA")
	env, ns, sourceState, targetState, _ := startMigrationPair(t, "live-a", "live-b", nil, withTLS(ca.dir(t, "live-a")), withTLS(ca.dir(t, "live-b")))
	ctx := context.Background()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm2"}, Spec: kaironv1.MachineSpec{NodeName: "live-a"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m = waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if len(m.Status.Addresses) != 1 || m.Status.Addresses[0].Address != "10.88.7.3" {
		t.Fatalf("second Machine on live-a has addresses %v, want 10.88.7.3", m.Status.Addresses)
	}
	endedBefore, downtimesBefore := migrationMetric(t, "live", "Succeeded", "Succeeded")
	mig := migrateLive(t, env, ns, "vm2", kaironv1.MigrationSucceeded)
	if mig.Status.SourceNode != "live-a" || mig.Status.TargetNode != "live-b" || mig.Status.DowntimeMillis <= 0 {
		t.Errorf("status %+v, want live-a → live-b with a downtime", mig.Status)
	}
	if !strings.Contains(mig.Status.Message, "runs on node live-b") {
		t.Errorf("message %q", mig.Status.Message)
	}
	if mig.Annotations[kaironv1.AnnotationMigrationStateSaved] != "true" || mig.Annotations[kaironv1.AnnotationMigrationDowntimeMillis] == "" {
		t.Errorf("annotations %v, want the source's hand-over and downtime", mig.Annotations)
	}
	testenv.Eventually(t, waitTimeout, "the migration counted in the metrics", func() (bool, string) {
		ended, downtimes := migrationMetric(t, "live", "Succeeded", "Succeeded")
		return ended == endedBefore+1 && downtimes == downtimesBefore+1,
			fmt.Sprintf("ended %v (before %v), downtimes %d (before %d)", ended, endedBefore, downtimes, downtimesBefore)
	})
	waitEvent(t, env, ns, "Machine", "vm2", "Migrated", "moved from node live-a to node live-b (live, migration live)")
	moved := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if moved.Spec.NodeName != "live-b" {
		t.Errorf("machine on %q after the migration, want live-b", moved.Spec.NodeName)
	}
	if len(moved.Status.Addresses) != 1 || moved.Status.Addresses[0].Address != "10.88.7.3" {
		t.Errorf("addresses after the migration %v, want the guest's 10.88.7.3 kept", moved.Status.Addresses)
	}
	testenv.Eventually(t, waitTimeout, "the source's copy gone and the target's running", func() (bool, string) {
		return !instanceExists(sourceState, ns, "vm2") && instanceExists(targetState, ns, "vm2") && !instancePaused(t, targetState, ns, "vm2"),
			"waiting for the source to stop its paused copy"
	})
}

// TestLiveMigrationFailureLeavesTheMachineOnTheSource: the target cannot
// load the guest; the migration fails with its reason and the guest runs on
// at the source, unpaused, with nothing left on the target.
func TestLiveMigrationFailureLeavesTheMachineOnTheSource(t *testing.T) {
	env, ns, sourceState, targetState, m := startMigrationPair(t, "live-fail-a", "live-fail-b",
		func(b *sim.Backend) backend.Backend { return failingReceive{b} }, nil, nil)
	failedBefore, _ := migrationMetric(t, "live", "Failed", "ReceiveFailed")
	mig := migrateLive(t, env, ns, "vm", kaironv1.MigrationFailed)
	waitEvent(t, env, ns, "MachineMigration", "live", "ReceiveFailed", "receiving the guest on node live-fail-b: injected receive failure")
	testenv.Eventually(t, waitTimeout, "the failure counted in the metrics", func() (bool, string) {
		failed, _ := migrationMetric(t, "live", "Failed", "ReceiveFailed")
		return failed == failedBefore+1, fmt.Sprintf("%v, before %v", failed, failedBefore)
	})
	if mig.Status.Reason != "ReceiveFailed" || !strings.Contains(mig.Status.Message, "injected receive failure") {
		t.Errorf("failed with %s: %s; want ReceiveFailed naming the target's error", mig.Status.Reason, mig.Status.Message)
	}
	guestStayedOnSource(t, env, m, "live-fail-a", sourceState, targetState)
}

// TestLiveMigrationRefusesAnAgentWithoutTheClusterCertificate: with TLS on,
// a source whose certificate another CA signed (for the right node name)
// cannot hand a guest over.
func TestLiveMigrationRefusesAnAgentWithoutTheClusterCertificate(t *testing.T) {
	env, ns, _, targetState, m := startMigrationPair(t, "live-tls-a", "live-tls-b", nil,
		withTLS(newMigrationCA(t, "intruder CA").dir(t, "live-tls-a")), withTLS(newMigrationCA(t, "kairon CA").dir(t, "live-tls-b")))
	mig := migrateLive(t, env, ns, "vm", kaironv1.MigrationFailed)
	if mig.Status.Reason != "TargetUnreachable" || !strings.Contains(mig.Status.Message, "TLS") {
		t.Errorf("failed with %s: %s; want TargetUnreachable from the TLS handshake", mig.Status.Reason, mig.Status.Message)
	}
	stayed := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if stayed.Spec.NodeName != "live-tls-a" || instanceExists(targetState, ns, "vm") {
		t.Errorf("machine on %q (target holds a copy: %v), want it on live-tls-a only", stayed.Spec.NodeName, instanceExists(targetState, ns, "vm"))
	}
}

// TestLiveMigrationTargetTakesOneStream plays a source by hand against a
// real target agent: the target accepts the first request for a Running
// live migration, refuses a second one meanwhile, and when the first
// stream breaks it fails the migration and keeps nothing.
func TestLiveMigrationTargetTakesOneStream(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	runControllers(t, env)
	targetState := t.TempDir()
	runSimAgent(t, env, "one-b", targetState, nil)
	// The source is a Node without an agent, so nobody else connects.
	source := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "one-a", Labels: map[string]string{kaironv1.LabelNode: "true"}},
	}
	if err := env.Client.Create(ctx, source); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), source) })
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "one-a"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the controllers may have written the Machine
	// since it was created.
	base := m.DeepCopy()
	m.Status.Phase = kaironv1.MachineRunning
	m.Status.ObservedGeneration = m.Generation
	if err := env.Client.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "live"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationLive, TargetNode: "one-b"},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationRunning)

	// The controller writes the endpoint once the agent published its port;
	// the migration may be Running before that.
	var endpoint string
	testenv.Eventually(t, 30*time.Second, "the controller to write one-b's migration endpoint", func() (bool, string) {
		target := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "one-b"}, target); err != nil {
			return false, err.Error()
		}
		endpoint = target.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
		return endpoint != "", fmt.Sprintf("annotations %v", target.Annotations)
	})
	ask := func(token string) (net.Conn, string) {
		t.Helper()
		conn, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
		if err != nil {
			t.Fatalf("migration endpoint %q: %v", endpoint, err)
		}
		t.Cleanup(func() { conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := fmt.Fprintf(conn, "KAIRON-LIVE/2 %s live %s\n", ns, token); err != nil {
			t.Fatal(err)
		}
		answer, _ := bufio.NewReader(conn).ReadString('\n')
		return conn, answer
	}
	key := client.ObjectKeyFromObject(mig)
	token := publishToken(t, env, key)
	if _, answer := ask(strings.Repeat("A", len(token))); answer != "ERR refused\n" {
		t.Errorf("a request with a wrong token answered %q, want a terse refusal", answer)
	}
	if _, answer := ask(token[:len(token)-1]); answer != "ERR refused\n" {
		t.Errorf("a request with a malformed token answered %q, want a terse refusal", answer)
	}
	first, answer := ask(token)
	if answer != "OK\n" {
		t.Fatalf("first request answered %q, want OK", answer)
	}
	if _, answer := ask(token); answer != "ERR refused\n" {
		t.Errorf("the token replayed answered %q, want a terse refusal: it was used", answer)
	}
	if _, answer := ask(publishToken(t, env, key)); !strings.HasPrefix(answer, "ERR node one-b is already receiving migration "+ns+"/live") {
		t.Errorf("second request with a fresh token answered %q, want a refusal while the first streams", answer)
	}
	first.Close() // the stream breaks before anything was sent

	failed := waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationFailed)
	if failed.Status.Reason != "ReceiveFailed" {
		t.Errorf("failed with %s: %s; want ReceiveFailed", failed.Status.Reason, failed.Status.Message)
	}
	if instanceExists(targetState, ns, "vm") {
		t.Error("the target kept an instance of the broken stream")
	}
	if got := &(kaironv1.Machine{}); env.Client.Get(ctx, client.ObjectKeyFromObject(m), got) == nil && got.Spec.NodeName != "one-a" {
		t.Errorf("machine moved to %q on a broken stream", got.Spec.NodeName)
	}
}

// guestStayedOnSource checks that a failed move left the Machine on source,
// its guest running (not paused) there and no copy on the target.
func guestStayedOnSource(t *testing.T, env *testenv.Env, m *kaironv1.Machine, source, sourceState, targetState string) {
	t.Helper()
	stayed := waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	if stayed.Spec.NodeName != source {
		t.Errorf("machine on %q, want it still on %s", stayed.Spec.NodeName, source)
	}
	testenv.Eventually(t, waitTimeout, "the source's guest running, nothing on the target", func() (bool, string) {
		return instanceExists(sourceState, m.Namespace, m.Name) && !instancePaused(t, sourceState, m.Namespace, m.Name) && !instanceExists(targetState, m.Namespace, m.Name),
			"source paused or target holds a copy"
	})
}
