package node_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/images"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/imagepull"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// withImageStore gives an agent an image cache in dir.
func withImageStore(t *testing.T, dir string) func(*node.Options) {
	t.Helper()
	store, err := images.NewStore(images.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return func(o *node.Options) { o.Images = imagepull.StoreOf(store) }
}

// blobCounter is a loopback proxy in front of a registry that counts the
// blob downloads per digest.
type blobCounter struct {
	addr string
	mu   sync.Mutex
	gets map[string]int
}

func countBlobs(t *testing.T, registry string) *blobCounter {
	t.Helper()
	c := &blobCounter{gets: map[string]int{}}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: registry})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if i := strings.Index(r.URL.Path, "/blobs/"); i >= 0 && r.Method == http.MethodGet {
			c.mu.Lock()
			c.gets[r.URL.Path[i+len("/blobs/"):]]++
			c.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c.addr = strings.TrimPrefix(srv.URL, "http://")
	return c
}

func (c *blobCounter) count(digest string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[digest]
}

func imageMachine(t *testing.T, env *testenv.Env, ns, name, nodeName, image string, secrets ...string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: nodeName, Image: image}}
	for _, s := range secrets {
		m.Spec.ImagePullSecrets = append(m.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// readyReason is the Machine's Ready condition's reason and message.
func readyReason(m *kaironv1.Machine) (string, string) {
	c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionReady.String())
	if c == nil {
		return "", ""
	}
	return c.Reason, c.Message
}

// eventsOf are the reasons and messages of the events about a Machine.
func eventsOf(t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			fmt.Fprintf(&b, "%s %s: %s\n", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

func waitFailed(t *testing.T, env *testenv.Env, key client.ObjectKey) *kaironv1.Machine {
	t.Helper()
	return waitPhase(t, env, key, kaironv1.MachineFailed)
}

// TestMachinesOfAnOCIImage runs Machines of an image from a real registry
// on a node with a real image cache (the sim backend: the VM is not what
// is tested here): ten Machines of one new image pull it once, each
// records the digest, and a missing image fails its Machine with the
// reference and the cause, leaving no partial file.
func TestMachinesOfAnOCIImage(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	front := countBlobs(t, reg.Addr)
	img := testenv.BusyboxImage(t, v1.Config{Env: []string{"GREETING=hi"}}, nil)
	digest := reg.Push(t, "team/app:1", img)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	layerDigest, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	imagesDir := t.TempDir()
	nodeName := ns + "-n"
	runSimAgent(t, env, nodeName, t.TempDir(), nil, withImageStore(t, imagesDir))

	ref := front.addr + "/team/app:1"
	for i := range 10 {
		imageMachine(t, env, ns, fmt.Sprintf("vm%d", i), nodeName, ref)
	}
	for i := range 10 {
		m := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("vm%d", i)}, kaironv1.MachineRunning)
		if m.Status.ImageDigest != digest {
			t.Errorf("%s: status.imageDigest %q, want %s", m.Name, m.Status.ImageDigest, digest)
		}
	}
	if n := front.count(layerDigest.String()); n != 1 {
		t.Errorf("the image's layer was downloaded %d times for ten Machines, want once", n)
	}
	testenv.Eventually(t, waitTimeout, "Pulling and Pulled events", func() (bool, string) {
		var all string
		for i := range 10 {
			all += eventsOf(t, env, ns, fmt.Sprintf("vm%d", i))
		}
		return strings.Contains(all, `Normal Pulling: Pulling image "`+ref+`"`) && strings.Count(all, "Normal Pulled: ") >= 10, all
	})

	missing := front.addr + "/team/missing:1"
	m := waitFailed(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "lost", nodeName, missing)))
	reason, message := readyReason(m)
	if reason != kaironv1.MachineReasonImagePullFailed || !strings.Contains(message, "team/missing:1") || !strings.Contains(strings.ToLower(message), "not found") {
		t.Errorf("a Machine of a missing image: Ready %s %q, want %s naming the reference and not found", reason, message, kaironv1.MachineReasonImagePullFailed)
	}
	if events := eventsOf(t, env, ns, "lost"); !strings.Contains(events, "Warning Failed: image "+missing) {
		t.Errorf("no Failed event naming %s:\n%s", missing, events)
	}
	entries, err := os.ReadDir(imagesDir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	if len(files) > 3 || !strings.Contains(strings.Join(files, " "), "index.json") {
		t.Errorf("the image cache holds %v: want the one image, its index and lock, nothing of the failed pull", files)
	}
}

// TestMachinePullsWithItsPullSecrets pulls from a registry that wants a
// password: without a secret the Machine fails as unauthorized; with one
// that does not exist yet it waits, and runs once the secret is created;
// a secret of the wrong type fails it naming the field.
func TestMachinePullsWithItsPullSecrets(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Users: map[string]string{"kairon": "s3cret"}})
	digest := reg.Push(t, "private/app:1", testenv.BusyboxImage(t, v1.Config{}, nil))
	nodeName := ns + "-n"
	runSimAgent(t, env, nodeName, t.TempDir(), nil, withImageStore(t, t.TempDir()))
	ref := reg.Ref("private/app:1")

	m := waitFailed(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "anonymous", nodeName, ref)))
	if reason, message := readyReason(m); reason != kaironv1.MachineReasonImagePullFailed || !strings.Contains(strings.ToLower(message), "unauthorized") {
		t.Errorf("without credentials: Ready %s %q, want ImagePullFailed, unauthorized", reason, message)
	}

	waiting := imageMachine(t, env, ns, "waiting", nodeName, ref, "registry-credentials")
	testenv.Eventually(t, waitTimeout, "the Machine Pending on its missing secret", func() (bool, string) {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(waiting), got); err != nil {
			return false, err.Error()
		}
		reason, message := readyReason(got)
		return got.Status.Phase == kaironv1.MachinePending && reason == kaironv1.MachineReasonPullingImage &&
			strings.Contains(message, `spec.imagePullSecrets[0] "registry-credentials"`), string(got.Status.Phase) + " " + reason + ": " + message
	})
	auth := base64.StdEncoding.EncodeToString([]byte("kairon:s3cret"))
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "registry-credentials"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: fmt.Appendf(nil, `{"auths": {%q: {"auth": %q}}}`, reg.Addr, auth)}}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	running := waitPhase(t, env, client.ObjectKeyFromObject(waiting), kaironv1.MachineRunning)
	if running.Status.ImageDigest != digest {
		t.Errorf("status.imageDigest %q, want %s", running.Status.ImageDigest, digest)
	}

	opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque"}, StringData: map[string]string{"password": "s3cret"}}
	if err := env.Client.Create(ctx, opaque); err != nil {
		t.Fatal(err)
	}
	m = waitFailed(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "opaque", nodeName, reg.Ref("private/other:1"), "opaque")))
	if reason, message := readyReason(m); reason != kaironv1.MachineReasonImagePullFailed || !strings.Contains(message, `spec.imagePullSecrets[0] "opaque" is of type "Opaque"`) {
		t.Errorf("with an Opaque secret: Ready %s %q", reason, message)
	}
}

// TestImageGuestMovesToANodeThatNeverPulledIt migrates (cold and live) a
// Machine of an image whose tag moved since it started, and restores its
// snapshot on another node: each target pulls the digest the guest runs,
// not what the tag names now.
func TestImageGuestMovesToANodeThatNeverPulledIt(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	for _, strategy := range []kaironv1.MigrationStrategy{kaironv1.MigrationCold, kaironv1.MigrationLive} {
		t.Run(string(strategy), func(t *testing.T) {
			env := testenv.Get(t)
			ns := env.Namespace(t)
			ctx := context.Background()
			reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
			first := reg.Push(t, "team/app:1", testenv.BusyboxImage(t, v1.Config{Env: []string{"V=1"}}, nil))
			source, target := ns+"-src", ns+"-dst"
			snapshots := t.TempDir()
			shared := func(o *node.Options) { o.SnapshotDir, o.SnapshotStore = snapshots, "shared" }
			sourceOpts := []func(*node.Options){shared, withImageStore(t, filepath.Join(t.TempDir(), "images"))}
			targetImages := filepath.Join(t.TempDir(), "images")
			targetOpts := []func(*node.Options){shared, withImageStore(t, targetImages)}
			if strategy == kaironv1.MigrationLive {
				ca := newMigrationCA(t, "kairon migration CA")
				sourceOpts = append(sourceOpts, withTLS(ca.dir(t, source)))
				targetOpts = append(targetOpts, withTLS(ca.dir(t, target)))
			}
			runControllers(t, env)
			runSimAgent(t, env, source, t.TempDir(), nil, sourceOpts...)
			runSimAgent(t, env, target, t.TempDir(), nil, targetOpts...)
			vm := waitPhase(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "vm", source, reg.Ref("team/app:1"))), kaironv1.MachineRunning)
			if vm.Status.ImageDigest != first {
				t.Fatalf("status.imageDigest %q, want %s", vm.Status.ImageDigest, first)
			}
			snap := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "vm"}}
			if err := env.Client.Create(ctx, snap); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, waitTimeout, "snapshot Ready", func() (bool, string) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
					return false, err.Error()
				}
				return snap.Status.Phase == kaironv1.SnapshotReady, string(snap.Status.Phase) + ": " + snap.Status.Message
			})
			if snap.Status.ImageDigest != first {
				t.Errorf("the snapshot's status.imageDigest %q, want %s", snap.Status.ImageDigest, first)
			}
			// The tag moves on.
			moved := reg.Push(t, "team/app:1", testenv.BusyboxImage(t, v1.Config{Env: []string{"V=2"}}, nil))
			if moved == first {
				t.Fatal("the new image has the old digest")
			}

			waitPhase(t, env, client.ObjectKeyFromObject(vm), kaironv1.MachineRunning)
			waitNodeReady(t, env, target)
			mig := &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
				Spec: kaironv1.MachineMigrationSpec{MachineName: "vm", TargetNode: target, Strategy: strategy}}
			if err := env.Client.Create(ctx, mig); err != nil {
				t.Fatal(err)
			}
			waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationSucceeded)
			after := waitPhase(t, env, client.ObjectKeyFromObject(vm), kaironv1.MachineRunning)
			if after.Spec.NodeName != target || after.Status.ImageDigest != first {
				t.Errorf("after the migration: on %s running %s, want on %s running %s (not the tag's %s)", after.Spec.NodeName, after.Status.ImageDigest, target, first, moved)
			}
			if !cachedOn(t, targetImages, first) {
				t.Errorf("the target's image cache does not hold %s", first)
			}

			// A third node, which never pulled anything, restores the
			// snapshot.
			third, thirdImages := ns+"-third", filepath.Join(t.TempDir(), "images")
			runSimAgent(t, env, third, t.TempDir(), nil, shared, withImageStore(t, thirdImages))
			waitNodeReady(t, env, third)
			restored := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "restored"},
				Spec: kaironv1.MachineSpec{NodeName: third, Image: reg.Ref("team/app:1"), RestoreFrom: &kaironv1.RestoreSource{SnapshotName: "snap"}}}
			if err := env.Client.Create(ctx, restored); err != nil {
				t.Fatal(err)
			}
			if got := waitPhase(t, env, client.ObjectKeyFromObject(restored), kaironv1.MachineRunning); got.Status.ImageDigest != first {
				t.Errorf("the Machine restored from the snapshot runs %q, want the snapshot's %s", got.Status.ImageDigest, first)
			}
			if !cachedOn(t, thirdImages, first) || cachedOn(t, thirdImages, moved) {
				t.Errorf("the restoring node's image cache should hold %s and not the tag's %s", first, moved)
			}
		})
	}
}

// cachedOn says whether the image cache in dir, which a running agent
// holds, lists digest.
func cachedOn(t *testing.T, dir, digest string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), digest)
}

// TestUnusedImagesAreCollected runs a node whose image cache may hold
// less than two images: once a Machine of one image is deleted while
// another runs, the first image goes and the one in use stays.
func TestUnusedImagesAreCollected(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	kept := reg.Push(t, "team/kept:1", testenv.BusyboxImage(t, v1.Config{Env: []string{"A=1"}}, nil))
	gone := reg.Push(t, "team/gone:1", testenv.BusyboxImage(t, v1.Config{Env: []string{"B=1"}}, nil))
	dir := t.TempDir()
	store, err := images.NewStore(images.Options{Dir: dir, DiskBudgetBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	nodeName := ns + "-n"
	runSimAgent(t, env, nodeName, t.TempDir(), nil, func(o *node.Options) {
		o.Images, o.ImageGCInterval = imagepull.StoreOf(store), 200*time.Millisecond
	})
	waitPhase(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "kept", nodeName, reg.Ref("team/kept:1"))), kaironv1.MachineRunning)
	old := waitPhase(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "old", nodeName, reg.Ref("team/gone:1"))), kaironv1.MachineRunning)
	if err := env.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	// Over its budget with both, the cache keeps the image of the Machine
	// that runs, and drops the deleted Machine's once it is no longer
	// among the recent pulls (kept a few seconds with this interval).
	testenv.Eventually(t, waitTimeout, "the deleted Machine's image collected", func() (bool, string) {
		_, hasKept := store.Lookup(kept)
		_, hasGone := store.Lookup(gone)
		return hasKept && !hasGone, fmt.Sprintf("kept there: %v, gone there: %v", hasKept, hasGone)
	})
}

// TestImageGuestClonesOnANodeThatNeverPulledIt saves a pool-style template
// Machine of an image on one node and starts a clone of it on another,
// whose cache is empty: the clone's node pulls the template's digest
// before it restores the clone.
func TestImageGuestClonesOnANodeThatNeverPulledIt(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	digest := reg.Push(t, "team/app:1", testenv.BusyboxImage(t, v1.Config{}, nil))
	pinned := reg.Ref("team/app:1") + "@" + digest
	suffix := ns[len(ns)-5:]
	nodeA, nodeB := suffix+"-img-a", suffix+"-img-b"
	bImages := filepath.Join(t.TempDir(), "images")
	runSnapshotAgent(t, env, nodeA, t.TempDir(), "", "10.88.41.0/24", withImageStore(t, filepath.Join(t.TempDir(), "images")))
	runSnapshotAgent(t, env, nodeB, t.TempDir(), "", "10.88.42.0/24", withImageStore(t, bImages))

	tmpl := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tmpl", Annotations: map[string]string{kaironv1.AnnotationSnapshotSave: "true"}},
		Spec:       kaironv1.MachineSpec{NodeName: nodeA, Image: pinned},
	}
	if err := env.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	saved := waitPhase(t, env, client.ObjectKeyFromObject(tmpl), kaironv1.MachineStopped)
	if saved.Status.Snapshot == nil || saved.Status.ImageDigest != digest {
		t.Fatalf("the template: snapshot %+v, image digest %q (want %s)", saved.Status.Snapshot, saved.Status.ImageDigest, digest)
	}
	clone := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "clone", Annotations: map[string]string{kaironv1.AnnotationRestoreFrom: "tmpl"}},
		Spec:       kaironv1.MachineSpec{NodeName: nodeB, Image: pinned},
	}
	if err := env.Client.Create(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if got := waitPhase(t, env, client.ObjectKeyFromObject(clone), kaironv1.MachineRunning); got.Status.ImageDigest != digest {
		t.Errorf("the clone on %s runs %q, want %s", nodeB, got.Status.ImageDigest, digest)
	}
	if !cachedOn(t, bImages, digest) {
		t.Errorf("node %s, which restored the clone, did not pull %s", nodeB, digest)
	}
}

// TestAFreshBootTakesTheImageTheSpecNamesNow stops a Machine of one tag,
// points its spec.image at another, and starts it again: the new VM runs
// the new tag's image, not the digest the Machine's last VM ran.
func TestAFreshBootTakesTheImageTheSpecNamesNow(t *testing.T) {
	host.SkipIfShort(t, "the control plane and a registry")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	first := reg.Push(t, "team/app:1", testenv.BusyboxImage(t, v1.Config{Env: []string{"V=1"}}, nil))
	second := reg.Push(t, "team/app:2", testenv.BusyboxImage(t, v1.Config{Env: []string{"V=2"}}, nil))
	nodeName := ns + "-n"
	runSimAgent(t, env, nodeName, t.TempDir(), nil, withImageStore(t, t.TempDir()))
	m := waitPhase(t, env, client.ObjectKeyFromObject(imageMachine(t, env, ns, "vm", nodeName, reg.Ref("team/app:1"))), kaironv1.MachineRunning)
	if m.Status.ImageDigest != first {
		t.Fatalf("status.imageDigest %q, want %s", m.Status.ImageDigest, first)
	}
	patch := func(spec map[string]any) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"spec": spec})
		if err := env.Client.Patch(ctx, m, client.RawPatch(types.MergePatchType, body)); err != nil {
			t.Fatal(err)
		}
	}
	patch(map[string]any{"powerState": "Stopped"})
	waitPhase(t, env, client.ObjectKeyFromObject(m), kaironv1.MachineStopped)
	patch(map[string]any{"powerState": "Running", "image": reg.Ref("team/app:2")})
	testenv.Eventually(t, waitTimeout, "the Machine Running the second tag's image", func() (bool, string) {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == kaironv1.MachineRunning && got.Status.ImageDigest == second,
			fmt.Sprintf("%s, image digest %s (first %s, second %s)", got.Status.Phase, got.Status.ImageDigest, first, second)
	})
}
