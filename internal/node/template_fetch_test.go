package node_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// sweepTimeout bounds the wait for the fetched-template sweep (every 15 s)
// on a loaded machine.
const sweepTimeout = 2 * time.Minute

// cloneMachine creates a clone of template on node.
func cloneMachine(t *testing.T, env *testenv.Env, ns, name, node, template string) {
	t.Helper()
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{kaironv1.AnnotationRestoreFrom: template}},
		Spec:       kaironv1.MachineSpec{NodeName: node, CPU: 1, Memory: resource.MustParse("256Mi")},
	}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// templateCopies lists the fetched template copies in an agent's state
// directory (complete ones: no download in progress).
func templateCopies(stateDir string) []string {
	files, _ := filepath.Glob(filepath.Join(stateDir, "fetched-templates", "*.state"))
	return files
}

// askForTemplate sends the migration listener of node a template request
// as another agent would (no TLS: the agents run with --migration-insecure)
// and returns its answer line.
func askForTemplate(t *testing.T, env *testenv.Env, node, ns, template string) string {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint], 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	token := strings.Repeat("A", base64.RawURLEncoding.EncodedLen(32))
	if _, err := fmt.Fprintf(conn, "KAIRON-TEMPLATE/1 %s %s %s\n", ns, template, token); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer to the template request: %v", err)
	}
	return strings.TrimSpace(line)
}

// Clones of a pool template on nodes other than the template's (sim
// backend, agents on loopback): the template's node records the file's
// SHA-256 when it saves it and serves the file only once a clone of it is
// placed elsewhere, and only for a saved template; a node with clones
// fetches the file once, checks it, and starts every clone from that one
// copy; a copy that does not match the template's digest is not used (the
// clone's start is retried, and succeeds once it matches); deleting the
// template deletes the copies.
func TestClonesFetchTheirTemplateFromItsNode(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	suffix := ns[len(ns)-5:]
	nodeA, nodeB, nodeC := suffix+"-tpl-a", suffix+"-tpl-b", suffix+"-tpl-c"
	stateA := runSnapshotAgent(t, env, nodeA, t.TempDir(), "", "10.88.31.0/24")
	stateB := runSnapshotAgent(t, env, nodeB, t.TempDir(), "", "10.88.32.0/24")
	stateC := runSnapshotAgent(t, env, nodeC, t.TempDir(), "", "10.88.33.0/24")

	tmpl := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tmpl", Annotations: map[string]string{kaironv1.AnnotationSnapshotSave: "true"}},
		Spec:       kaironv1.MachineSpec{NodeName: nodeA, CPU: 1, Memory: resource.MustParse("256Mi")},
	}
	if err := env.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	plain := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"},
		Spec: kaironv1.MachineSpec{NodeName: nodeA, CPU: 1, Memory: resource.MustParse("256Mi")}}
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	saved := waitPhase(t, env, client.ObjectKeyFromObject(tmpl), kaironv1.MachineStopped)
	snap := saved.Status.Snapshot
	if snap == nil {
		t.Fatalf("template Stopped without status.snapshot: %+v", saved.Status)
	}
	digest := testenv.FileSHA256(t, snap.Path)
	if snap.SHA256 != digest || !strings.HasPrefix(snap.Path, stateA) {
		t.Errorf("status.snapshot %+v; the file's SHA-256 is %s", snap, digest)
	}

	// Nobody gets the file before a clone of it is placed elsewhere, and
	// nobody gets a Machine that is no saved template.
	if got := askForTemplate(t, env, nodeA, ns, "tmpl"); strings.HasPrefix(got, "OK") {
		t.Errorf("the template's node served its file with no clone placed elsewhere: %q", got)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(plain), kaironv1.MachineRunning)
	cloneMachine(t, env, ns, "plain-clone", nodeB, "plain")
	if got := askForTemplate(t, env, nodeA, ns, "plain"); strings.HasPrefix(got, "OK") {
		t.Errorf("node %s served Machine plain, which is no template: %q", nodeA, got)
	}

	// Two clones at once on node B: one fetch, one checked copy.
	cloneMachine(t, env, ns, "clone-1", nodeB, "tmpl")
	cloneMachine(t, env, ns, "clone-2", nodeB, "tmpl")
	for _, name := range []string{"clone-1", "clone-2"} {
		m := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: name}, kaironv1.MachineRunning)
		if len(m.Status.Addresses) == 0 || !strings.HasPrefix(m.Status.Addresses[0].Address, "10.88.32.") {
			t.Errorf("%s: addresses %v, want one of node %s's", name, m.Status.Addresses, nodeB)
		}
	}
	copies := templateCopies(stateB)
	if len(copies) != 1 {
		t.Fatalf("fetched copies on %s: %v, want one", nodeB, copies)
	}
	if got := testenv.FileSHA256(t, copies[0]); got != digest {
		t.Errorf("the copy on %s: SHA-256 %s, want %s", nodeB, got, digest)
	}
	before, err := os.Stat(copies[0])
	if err != nil {
		t.Fatal(err)
	}
	// A later clone there uses the copy: it is not fetched again.
	cloneMachine(t, env, ns, "clone-3", nodeB, "tmpl")
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "clone-3"}, kaironv1.MachineRunning)
	after, err := os.Stat(copies[0])
	if err != nil || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) || len(templateCopies(stateB)) != 1 {
		t.Errorf("the copy was fetched again for clone-3 (%v): %v", err, templateCopies(stateB))
	}

	// A copy that does not match the template's digest is not used.
	setDigest := func(sha string) {
		t.Helper()
		cur := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), cur); err != nil {
			t.Fatal(err)
		}
		base := cur.DeepCopy()
		cur.Status.Snapshot.SHA256 = sha
		if err := env.Client.Status().Patch(ctx, cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			t.Fatal(err)
		}
	}
	wrong := strings.Repeat("0", 64)
	setDigest(wrong)
	cloneMachine(t, env, ns, "clone-c", nodeC, "tmpl")
	testenv.Eventually(t, waitTimeout, "clone-c's start to be retried for a copy that does not check out", func() (bool, string) {
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "clone-c"}, m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase != kaironv1.MachineRunning && strings.Contains(m.Status.Message, "its status.snapshot.sha256 is "+wrong), m.Status.Message
	})
	if copies := templateCopies(stateC); len(copies) != 0 {
		t.Errorf("a copy that does not check out was kept on %s: %v", nodeC, copies)
	}
	setDigest(digest)
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "clone-c"}, kaironv1.MachineRunning)

	// The template goes: so do the copies.
	if err := env.Client.Delete(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, sweepTimeout, "the fetched copies deleted with their template", func() (bool, string) {
		b, c := templateCopies(stateB), templateCopies(stateC)
		_, err := os.Stat(snap.Path)
		return len(b) == 0 && len(c) == 0 && os.IsNotExist(err), fmt.Sprint(b, c, err)
	})
}
