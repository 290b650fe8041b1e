package node_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
	"github.com/zyvor/kairon/internal/testenv"
)

// Attacks on a cold migration's saved state, which the source agent serves
// on its migration listener to the migration's target node only, against
// a one-time token (issue 10, findings 2 and 3).

// TestSavedStateGoesOnlyToTheTarget plays peers by hand against a real
// source agent holding a saved guest: no certificate, another node's
// certificate with the right token, the target's certificate with a wrong
// token, then the target's with the right one (served, once), and the same
// token replayed. The guest then runs on again on the source when the
// migration fails.
func TestSavedStateGoesOnlyToTheTarget(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	runControllers(t, env)
	ca := newMigrationCA(t, "kairon migration CA")
	sourceState, targetState := t.TempDir(), t.TempDir()
	runSimAgent(t, env, "st-a", sourceState, nil, withTLS(ca.dir(t, "st-a")))
	// The target is a ready Node without an agent: the test is its agent.
	target := rulestest.Node("st-b", 4, "4Gi")
	status := target.Status
	if err := env.Client.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), target) })
	target.Status = status
	if err := env.Client.Status().Update(ctx, target); err != nil {
		t.Fatal(err)
	}
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}, Spec: kaironv1.MachineSpec{NodeName: "st-a"}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineRunning)
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationCold, TargetNode: "st-b"},
	}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(mig)
	testenv.Eventually(t, waitTimeout, "the source saved the guest", func() (bool, string) {
		if err := env.Client.Get(ctx, key, mig); err != nil {
			return false, err.Error()
		}
		return mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true", fmt.Sprintf("%s %v", mig.Status.Phase, mig.Annotations)
	})
	var endpoint string
	testenv.Eventually(t, waitTimeout, "the controller to write st-a's migration endpoint", func() (bool, string) {
		source := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "st-a"}, source); err != nil {
			return false, err.Error()
		}
		endpoint = source.Annotations[kaironv1.AnnotationNodeMigrationEndpoint]
		return endpoint != "", fmt.Sprintf("annotations %v", source.Annotations)
	})

	// fetch asks for the state as config with token; it returns the
	// answer line and, after an OK, how many bytes followed.
	fetch := func(config *tls.Config, token string) (answer string, body int64, err error) {
		t.Helper()
		raw, err := net.DialTimeout("tcp", endpoint, 5*time.Second)
		if err != nil {
			t.Fatalf("migration endpoint %q: %v", endpoint, err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(20 * time.Second))
		conn := tls.Client(raw, config)
		if err := conn.Handshake(); err != nil {
			return "", 0, err
		}
		if _, err := fmt.Fprintf(conn, "KAIRON-STATE/1 %s move %s\n", ns, token); err != nil {
			return "", 0, err
		}
		in := bufio.NewReader(conn)
		answer, err = in.ReadString('\n')
		if !strings.HasPrefix(answer, "OK ") {
			return answer, 0, err
		}
		body, err = io.Copy(io.Discard, in)
		if size, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(answer, "OK ")), 10, 64); size != body {
			t.Errorf("announced %q, sent %d bytes", answer, body)
		}
		return answer, body, err
	}

	token := publishToken(t, env, key)
	if answer, _, err := fetch(ca.tlsClient(t, ""), token); err == nil || answer != "" {
		t.Errorf("a peer without a certificate: %q, %v; want the connection refused", answer, err)
	}
	if answer, _, _ := fetch(newMigrationCA(t, "intruder CA").tlsClient(t, "st-b"), token); answer != "" {
		t.Errorf("the target's name on another CA's certificate: %q; want the connection refused", answer)
	}
	if answer, n, _ := fetch(ca.tlsClient(t, "st-c"), token); answer != "ERR refused\n" || n != 0 {
		t.Errorf("another node's certificate with the right token: %q and %d bytes, want a terse refusal", answer, n)
	}
	if answer, n, _ := fetch(ca.tlsClient(t, "st-b"), strings.Repeat("A", len(token))); answer != "ERR refused\n" || n != 0 {
		t.Errorf("the target's certificate with a wrong token: %q and %d bytes, want a terse refusal", answer, n)
	}
	if answer, n, err := fetch(ca.tlsClient(t, "st-b"), token); !strings.HasPrefix(answer, "OK ") || n == 0 {
		t.Errorf("the target's certificate and token: %q, %d bytes, %v; want the state", answer, n, err)
	}
	if answer, n, _ := fetch(ca.tlsClient(t, "st-b"), token); answer != "ERR refused\n" || n != 0 {
		t.Errorf("the token replayed with the target's certificate: %q and %d bytes, want a terse refusal", answer, n)
	}

	// The target gives up (as it would on a failed restore): the guest
	// runs on on the source.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, key, mig); err != nil {
			return err
		}
		mig.Status.Phase, mig.Status.Reason, mig.Status.Message = kaironv1.MigrationFailed, kaironv1.MigrationReasonRestoreFailed, "the test's target gave up"
		return env.Client.Status().Update(ctx, mig)
	}); err != nil {
		t.Fatal(err)
	}
	guestStayedOnSource(t, env, m, "st-a", sourceState, targetState)
}

// TestColdMigrationRefusesATargetWithAnotherNodesCertificate: the target
// agent holds a certificate of the cluster CA, but another node's; the
// source does not hand it the saved guest, the migration fails, and the
// guest runs on on the source.
func TestColdMigrationRefusesATargetWithAnotherNodesCertificate(t *testing.T) {
	ca := newMigrationCA(t, "kairon migration CA")
	env, ns, sourceState, targetState, m := startMigrationPair(t, "cold-id-a", "cold-id-b", nil,
		withTLS(ca.dir(t, "cold-id-a")), withTLS(ca.dir(t, "cold-id-c")))
	mig := &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", Strategy: kaironv1.MigrationCold, TargetNode: "cold-id-b"},
	}
	if err := env.Client.Create(context.Background(), mig); err != nil {
		t.Fatal(err)
	}
	mig = waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationFailed)
	if mig.Status.Reason != kaironv1.MigrationReasonTransferFailed || !strings.HasSuffix(mig.Status.Message, "refused the saved state: refused") {
		t.Errorf("failed with %s: %s; want TransferFailed with a terse refusal", mig.Status.Reason, mig.Status.Message)
	}
	guestStayedOnSource(t, env, m, "cold-id-a", sourceState, targetState)
}
