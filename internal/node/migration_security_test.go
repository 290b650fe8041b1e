package node_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// Attacks on the live migration endpoint (issue 10, finding 2).

// TestLiveMigrationRefusesASourceWithAnotherNodesCertificate: the source
// agent holds a certificate of the cluster CA, but another node's: the
// target refuses the guest, which keeps running on the source.
func TestLiveMigrationRefusesASourceWithAnotherNodesCertificate(t *testing.T) {
	ca := newMigrationCA(t, "kairon migration CA")
	env, ns, sourceState, targetState, m := startMigrationPair(t, "live-id-a", "live-id-b", nil,
		withTLS(ca.dir(t, "live-id-c")), withTLS(ca.dir(t, "live-id-b")))
	mig := migrateLive(t, env, ns, "vm", kaironv1.MigrationFailed)
	if mig.Status.Reason != "TargetRefused" || !strings.HasSuffix(mig.Status.Message, "refused the guest: refused") {
		t.Errorf("failed with %s: %s; want TargetRefused with a terse answer", mig.Status.Reason, mig.Status.Message)
	}
	guestStayedOnSource(t, env, m, "live-id-a", sourceState, targetState)
}

// TestLiveMigrationSendsOnlyToTheTargetNode: the agent at the target's
// endpoint presents another node's certificate (as a compromised node that
// rewrote the endpoint annotation would): the source does not send.
func TestLiveMigrationSendsOnlyToTheTargetNode(t *testing.T) {
	ca := newMigrationCA(t, "kairon migration CA")
	env, ns, sourceState, targetState, m := startMigrationPair(t, "live-to-a", "live-to-b", nil,
		withTLS(ca.dir(t, "live-to-a")), withTLS(ca.dir(t, "live-to-c")))
	mig := migrateLive(t, env, ns, "vm", kaironv1.MigrationFailed)
	if mig.Status.Reason != "TargetUnreachable" || !strings.Contains(mig.Status.Message, "not node live-to-b's") {
		t.Errorf("failed with %s: %s; want TargetUnreachable: the certificate is not live-to-b's", mig.Status.Reason, mig.Status.Message)
	}
	guestStayedOnSource(t, env, m, "live-to-a", sourceState, targetState)
}

// publishToken plays the connecting agent's part of the one-time token: it
// puts the hash of a fresh token on migration key and returns the token.
func publishToken(t *testing.T, env *testenv.Env, key client.ObjectKey) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token := base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mig := &kaironv1.MachineMigration{}
		if err := env.Client.Get(context.Background(), key, mig); err != nil {
			return err
		}
		if mig.Annotations == nil {
			mig.Annotations = map[string]string{}
		}
		mig.Annotations[kaironv1.AnnotationMigrationTransferToken] = hex.EncodeToString(sum[:])
		return env.Client.Update(context.Background(), mig)
	}); err != nil {
		t.Fatal(err)
	}
	return token
}

// runningLiveMigration makes a Running live migration "live" of Machine
// "vm" from source, a Node without an agent (nobody else connects), to the
// agent target; it returns the target's migration endpoint.
func runningLiveMigration(t *testing.T, env *testenv.Env, ns, source, target string) (mig *kaironv1.MachineMigration, endpoint string) {
	t.Helper()
	ctx := context.Background()
	src := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: source, Labels: map[string]string{kaironv1.LabelNode: "true"}}}
	if err := env.Client.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), src) })
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: source}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		m.Status.Phase = kaironv1.MachineRunning
		m.Status.ObservedGeneration = m.Generation
		return env.Client.Status().Update(ctx, m)
	}); err != nil {
		t.Fatal(err)
	}
	mig = &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "live"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationLive, TargetNode: target},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig = waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationRunning)
	testenv.Eventually(t, waitTimeout, "the target's migration endpoint", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: target}, n); err != nil {
			return false, err.Error()
		}
		endpoint = n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
		return endpoint != "", "no endpoint annotation"
	})
	return mig, endpoint
}

// TestLiveMigrationListenerRefusesAttackers plays attackers by hand against
// a real target agent with mutual TLS: a peer without a certificate, with a
// certificate of another CA, with another node's certificate, with a
// malformed request, and peers that send nothing (slow header) are all
// refused, tersely, and leave the migration Running; the handshake slots
// they held are freed. The source's certificate is then accepted.
func TestLiveMigrationListenerRefusesAttackers(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	runControllers(t, env)
	ca := newMigrationCA(t, "kairon migration CA")
	targetState := t.TempDir()
	runSimAgent(t, env, "att-b", targetState, nil, withTLS(ca.dir(t, "att-b")), func(o *node.Options) {
		// Long enough that the slow peers below still hold their slots
		// when the third arrives, however loaded the machine.
		o.MigrationHandshakeTimeout = 10 * time.Second
		o.MigrationMaxHandshakes = 2
	})
	mig, endpoint := runningLiveMigration(t, env, ns, "att-a", "att-b")
	token := publishToken(t, env, client.ObjectKeyFromObject(mig))
	request := fmt.Sprintf("KAIRON-LIVE/2 %s live %s\n", ns, token)

	// ask connects with config, sends line and returns the answer (or the
	// error that ended the connection) and the connection.
	ask := func(config *tls.Config, line string) (string, net.Conn, error) {
		t.Helper()
		raw, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
		if err != nil {
			t.Fatalf("migration endpoint %q: %v", endpoint, err)
		}
		t.Cleanup(func() { raw.Close() })
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		conn := tls.Client(raw, config)
		if err := conn.Handshake(); err != nil {
			return "", conn, err
		}
		if _, err := io.WriteString(conn, line); err != nil {
			return "", conn, err
		}
		answer, err := bufio.NewReader(conn).ReadString('\n')
		return answer, conn, err
	}
	stillRunning := func(when string) {
		t.Helper()
		got := &kaironv1.MachineMigration{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(mig), got); err != nil || got.Status.Phase != kaironv1.MigrationRunning {
			t.Fatalf("%s: migration %v %q, want it still Running", when, err, got.Status.Phase)
		}
		if instanceExists(targetState, ns, "vm") {
			t.Fatalf("%s: the target holds an instance", when)
		}
	}

	if answer, _, err := ask(ca.tlsClient(t, ""), request); err == nil || answer != "" {
		t.Errorf("peer without a certificate: answer %q, err %v; want the connection refused", answer, err)
	}
	if answer, _, err := ask(newMigrationCA(t, "intruder CA").tlsClient(t, "att-a"), request); err == nil || answer != "" {
		t.Errorf("peer with another CA's certificate: answer %q, err %v; want the connection refused", answer, err)
	}
	if answer, _, _ := ask(ca.tlsClient(t, "att-c"), request); answer != "ERR refused\n" {
		t.Errorf("peer with another node's certificate: answer %q, want a terse ERR refused", answer)
	}
	if answer, _, _ := ask(ca.tlsClient(t, "att-c"), "KAIRON-LIVE/2 ../etc passwd "+token+"\n"); answer != "ERR refused\n" {
		t.Errorf("malformed request: answer %q, want a terse ERR refused", answer)
	}
	if answer, _, _ := ask(ca.tlsClient(t, "att-c"), strings.Repeat("A", 4096)+"\n"); answer != "" {
		t.Errorf("a request line of 4 KiB: answer %q, want the connection dropped", answer)
	}
	stillRunning("after the refusals")

	// Slow header: two peers that connect and send nothing hold both
	// handshake slots; a third is dropped at once; the two are cut off
	// after the handshake timeout, and the slots are free again.
	var slow []net.Conn
	for range 2 {
		c, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		slow = append(slow, c)
	}
	// The listener accepts in dial order, so the third peer comes after the
	// two slow ones hold both slots: it must be closed by the target while
	// they are still waiting for their handshake timeout.
	third, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { third.Close() })
	_ = third.SetReadDeadline(time.Now().Add(waitTimeout))
	if n, err := third.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Errorf("a third peer while two handshakes are pending: read %d bytes, %v; want it closed by the target", n, err)
	}
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
			t.Errorf("slow peer %d was cut off (%v) before the third peer was dropped; the third must be refused for want of a slot, not a timeout", i, err)
		}
	}
	// The slow peers are cut off by the handshake timeout, not left open.
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
		n, err := c.Read(make([]byte, 1))
		if n != 0 || err == nil || isTimeout(err) {
			t.Errorf("slow peer %d: read %d bytes, %v; want the target to cut it off", i, n, err)
		}
	}
	stillRunning("after the slow peers")

	// The source's own certificate is accepted: the refusals above were the
	// checks', not a broken listener's.
	testenv.Eventually(t, waitTimeout, "the source's certificate accepted", func() (bool, string) {
		answer, conn, err := ask(ca.tlsClient(t, "att-a"), request)
		if answer == "OK\n" {
			conn.Close() // the stream breaks: the migration fails, nothing kept
			return true, ""
		}
		return false, fmt.Sprintf("answer %q, err %v", answer, err)
	})
	failed := waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationFailed)
	if failed.Status.Reason != "ReceiveFailed" {
		t.Errorf("failed with %s: %s; want ReceiveFailed", failed.Status.Reason, failed.Status.Message)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestLiveMigrationListenerWillNotStartInPlainText: without TLS, an agent
// refuses to accept live migrations on a non-loopback address unless
// --migration-insecure says so.
func TestLiveMigrationListenerWillNotStartInPlainText(t *testing.T) {
	for _, c := range []struct {
		listen, tlsDir string
		insecure, ok   bool
	}{
		{listen: ":10251"}, {listen: "0.0.0.0:0"}, {listen: "10.88.0.1:10251"}, {listen: "[::]:0"},
		{listen: ":10251", insecure: true, ok: true},
		{listen: ":10251", tlsDir: "/etc/kairon/migration-tls", ok: true},
		{listen: "127.0.0.1:0", ok: true}, {listen: "[::1]:0", ok: true}, {listen: "", ok: true},
	} {
		err := node.CheckMigrationTransport(c.listen, c.tlsDir, c.insecure)
		if (err == nil) != c.ok {
			t.Errorf("listen %q tls %q insecure %v: %v, want ok %v", c.listen, c.tlsDir, c.insecure, err, c.ok)
		}
	}

	env := testenv.Get(t)
	stateDir := t.TempDir()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain-a"}})
	})
	// 0.0.0.0 binds to the node's InternalIP, here loopback; that the
	// operator asked for every address in plain text is refused all the same.
	agent, err := node.New(env.Config, node.Options{
		NodeName: "plain-a", Register: true, Backend: b, StateDir: stateDir, CPU: 1, Interval: time.Second,
		MigrationListenAddress: "0.0.0.0:0",
	})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = agent.Run(ctx)
	}
	if err == nil || !strings.Contains(err.Error(), "plain TCP") {
		t.Errorf("agent with a plain-text migration listener on 0.0.0.0: %v, want a refusal", err)
	}
	n := &corev1.Node{}
	if getErr := env.Client.Get(context.Background(), client.ObjectKey{Name: "plain-a"}, n); getErr == nil && n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint] != "" {
		t.Errorf("the refused listener was advertised: %q", n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint])
	}
}

// hookedReceive is a sim backend whose ReceiveLive runs hook after reading
// the stream's first line, then starts the guest.
type hookedReceive struct {
	*sim.Backend
	hook func()
}

func (h hookedReceive) ReceiveLive(ctx context.Context, spec backend.Spec, r io.Reader) (backend.Instance, error) {
	if _, err := bufio.NewReader(r).ReadString('\n'); err != nil {
		return backend.Instance{}, err
	}
	h.hook()
	return h.Backend.Start(ctx, spec)
}

// TestLiveMigrationTargetSwitchesOnlyARunningMigration: the migration fails
// (here: set by hand, as the controller's timeout would) while the target
// loads the guest; the target then reads it afresh, does not switch the
// Machine, and drops what it loaded.
func TestLiveMigrationTargetSwitchesOnlyARunningMigration(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	runControllers(t, env)
	targetState := t.TempDir()
	var key client.ObjectKey
	failIt := func() {
		mig := &kaironv1.MachineMigration{}
		if err := env.Client.Get(ctx, key, mig); err != nil {
			t.Error(err)
			return
		}
		mig.Status.Phase, mig.Status.Reason, mig.Status.Message = kaironv1.MigrationFailed, "Timeout", "failed meanwhile"
		if err := env.Client.Status().Update(ctx, mig); err != nil {
			t.Error(err)
		}
	}
	runSimAgent(t, env, "sw-b", targetState, func(b *sim.Backend) backend.Backend { return hookedReceive{b, failIt} })
	mig, endpoint := runningLiveMigration(t, env, ns, "sw-a", "sw-b")
	key = client.ObjectKeyFromObject(mig)
	conn, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	in := bufio.NewReader(conn)
	if _, err := fmt.Fprintf(conn, "KAIRON-LIVE/2 %s live %s\n", ns, publishToken(t, env, key)); err != nil {
		t.Fatal(err)
	}
	if answer, _ := in.ReadString('\n'); answer != "OK\n" {
		t.Fatalf("request answered %q, want OK", answer)
	}
	if _, err := io.WriteString(conn, "the guest\n"); err != nil {
		t.Fatal(err)
	}
	answer, _ := in.ReadString('\n')
	if !strings.HasPrefix(answer, "ERR ") || !strings.Contains(answer, "not Running") {
		t.Errorf("after the stream, answer %q; want a refusal to switch a migration no longer Running", answer)
	}
	m := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm"}, m); err != nil || m.Spec.NodeName != "sw-a" {
		t.Errorf("machine on %q (%v), want it left on sw-a", m.Spec.NodeName, err)
	}
	testenv.Eventually(t, waitTimeout, "the target's copy dropped", func() (bool, string) {
		return !instanceExists(targetState, ns, "vm"), "the target holds an instance"
	})
}

// TestMigrationListenerBindsToTheInternalIP: --migration-listen without a
// host binds to the Node's InternalIP only (here 127.0.0.2, a loopback
// address that is not 127.0.0.1): the port is not open on the node's other
// addresses, which on a real node include the guests' gateway. A host in
// the guests' network is refused outright.
func TestMigrationListenerBindsToTheInternalIP(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bind-a"}}
	if err := env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "bind-a"}, {Type: corev1.NodeInternalIP, Address: "127.0.0.2"}}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	ca := newMigrationCA(t, "kairon migration CA")
	runControllers(t, env)
	runSimAgent(t, env, "bind-a", t.TempDir(), nil, withTLS(ca.dir(t, "bind-a")), func(o *node.Options) {
		o.Register = false
		o.MigrationListenAddress = ":0"
	})
	var endpoint string
	testenv.Eventually(t, waitTimeout, "the migration endpoint", func() (bool, string) {
		got := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "bind-a"}, got); err != nil {
			return false, err.Error()
		}
		endpoint = got.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
		return endpoint != "", fmt.Sprintf("annotations %v", got.Annotations)
	})
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil || host != "127.0.0.2" {
		t.Fatalf("endpoint %q (%v), want the InternalIP 127.0.0.2", endpoint, err)
	}
	if c, err := net.DialTimeout("tcp", endpoint, 5*time.Second); err != nil {
		t.Errorf("the listener is not on the InternalIP %s: %v", endpoint, err)
	} else {
		c.Close()
	}
	for _, other := range []string{"127.0.0.1", "127.0.0.3"} {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(other, port), 5*time.Second); err == nil {
			c.Close()
			t.Errorf("the migration port %s is open on %s too, not only on the InternalIP", port, other)
		}
	}

	b, err := sim.New(sim.Options{StateDir: filepath.Join(t.TempDir(), "instances")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = node.New(env.Config, node.Options{
		NodeName: "bind-b", Register: true, Backend: b, StateDir: t.TempDir(), CPU: 1,
		Network:                &node.NetworkOptions{CIDR: netip.MustParsePrefix("127.0.0.0/24"), NoLinks: true},
		MigrationListenAddress: "127.0.0.1:0",
	})
	if err == nil || !strings.Contains(err.Error(), "guests' network") {
		t.Errorf("a migration listener on the guests' gateway: %v, want a refusal", err)
	}
}
