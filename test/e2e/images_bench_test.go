package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/qemu"
	"github.com/zyvor/kairon/internal/images"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/userimages"
)

// TestImagesBench is make bench-images (KAIRON_IMAGES_BENCH=1): the cost
// of an OCI image against the built-in guest, each pair measured in turn
// in one run so that the machine's load weighs on both alike:
//
//   - pulling and converting kairon/python:3.11 from a loopback registry
//     into a node's cache, cold (an empty cache) and warm (cached);
//   - the disk a cached image takes;
//   - a cold boot to Running, default guest against the python image
//     (cached), and the VM's resident memory once ready;
//   - a warm claim's bind (status.bindMillis) from a pool of each.
//
// KAIRON_IMAGES_BENCH_RUNS sets the runs of each (default 5).
func TestImagesBench(t *testing.T) {
	if os.Getenv("KAIRON_IMAGES_BENCH") != "1" {
		t.Skip("a benchmark: make bench-images (KAIRON_IMAGES_BENCH=1)")
	}
	runs := 5
	if v := os.Getenv("KAIRON_IMAGES_BENCH_RUNS"); v != "" {
		if _, err := fmt.Sscan(v, &runs); err != nil || runs < 1 {
			t.Fatalf("KAIRON_IMAGES_BENCH_RUNS=%q: want a positive number", v)
		}
	}
	ctx := context.Background()
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	if _, err := userimages.Python.Ensure(ctx, reg.Addr, userimages.Options{}); err != nil {
		t.Fatal(err)
	}
	ref := reg.Ref(userimages.Python.Name())

	// Pull and convert.
	var cold, warm []time.Duration
	var cached *images.Image
	for i := range runs {
		store, err := images.NewStore(images.Options{Dir: filepath.Join(t.TempDir(), fmt.Sprint("cache", i))})
		if err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		img, err := store.Ensure(ctx, ref, authn.DefaultKeychain)
		if err != nil {
			t.Fatal(err)
		}
		cold = append(cold, time.Since(began))
		began = time.Now()
		if _, err := store.Ensure(ctx, ref, authn.DefaultKeychain); err != nil {
			t.Fatal(err)
		}
		warm = append(warm, time.Since(began))
		cached = img
		t.Cleanup(func() { _ = store.Close() })
	}
	t.Logf("pull+convert %s, cold cache: %s", ref, spread(cold))
	t.Logf("pull+convert %s, warm cache: %s", ref, spread(warm))
	t.Logf("disk per cached image: %.1f MiB (squashfs, lz4)", float64(cached.SizeBytes)/(1<<20))

	// Cold boots, interleaved.
	be, err := qemu.New(qemu.Options{StateDir: shortDir(t), GuestDir: filepath.Join(testenv.BinDir(t), "guest")})
	if err != nil {
		t.Fatal(err)
	}
	var boot [2][]time.Duration
	var rss [2][]float64
	for i := range runs {
		for k, root := range []string{"", cached.Path} {
			id := fmt.Sprintf("bench_img%d_%d", i, k)
			if _, err := be.Start(ctx, backend.Spec{ID: id, Name: "bench/img", CPU: 1, MemoryMiB: 512, RootImage: root}); err != nil {
				t.Fatal(err)
			}
			var inst backend.Instance
			testenv.Eventually(t, 3*time.Minute, "the guest Running", func() (bool, string) {
				inst, err = be.Get(ctx, id)
				return err == nil && inst.Phase == backend.Running, fmt.Sprintf("%+v %v", inst, err)
			})
			boot[k] = append(boot[k], inst.ReadyAfter)
			rss[k] = append(rss[k], float64(rssKiB(inst.PID))/1024)
			if err := be.Stop(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	accel := be.Acceleration()
	t.Logf("cold boot to Running (%s), default guest: %s; RSS once ready %s MiB", accel, spread(boot[0]), spreadFloat(rss[0]))
	t.Logf("cold boot to Running (%s), python image:  %s; RSS once ready %s MiB", accel, spread(boot[1]), spreadFloat(rss[1]))
	t.Logf("image boot / default boot, medians: %.0f%%", 100*float64(median(boot[1]))/float64(median(boot[0])))

	// Warm claims from a pool of each.
	env := testenv.Get(t)
	ns := env.Namespace(t)
	netNS := netns(t)
	state := shortDir(t)
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	startAgentWithCapacity(t, env, ns+"-bench", state, netNS, 4, "4Gi")
	deleteNodeAtEnd(t, env, ns+"-bench")
	for _, p := range []struct{ name, image string }{{"default", "default"}, {"python", ref}} {
		env.KubectlStdin(t, fmt.Sprintf("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: MachinePool\nmetadata: {name: %s}\nspec:\n  replicas: 1\n  template:\n    spec: {cpu: 1, memory: 512Mi, image: %q}\n", p.name, p.image), "-n", ns, "apply", "-f", "-")
	}
	var bind [2][]time.Duration
	for i := range runs {
		for k, pool := range []string{"default", "python"} {
			testenv.Eventually(t, 5*time.Minute, "a Running warm member of "+pool, func() (bool, string) {
				out := jsonpathQuiet(env, testenv.Query{Namespace: ns, Resource: "machinepools", Name: pool}, "{.status.readyWarm}")
				return out == "1", out
			})
			name := fmt.Sprintf("%s-%d", pool, i)
			claim := &kaironv1.MachineClaim{}
			claim.Namespace, claim.Name, claim.Spec.PoolName = ns, name, pool
			if err := env.Client.Create(ctx, claim); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "claim "+name+" Bound", func() (bool, string) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
					return false, err.Error()
				}
				return claim.Status.Phase == kaironv1.ClaimBound && claim.Status.BindMillis > 0, string(claim.Status.Phase)
			})
			bind[k] = append(bind[k], time.Duration(claim.Status.BindMillis)*time.Millisecond)
			if err := env.Client.Delete(ctx, claim); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("warm claim bind (status.bindMillis), default pool: %s", spread(bind[0]))
	t.Logf("warm claim bind (status.bindMillis), python pool:  %s", spread(bind[1]))
}

// spread is a sample's median, min and max.
func spread(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	r := func(x time.Duration) time.Duration { return x.Round(time.Millisecond) }
	return fmt.Sprintf("median %s (min %s, max %s, n=%d)", r(median(s)), r(s[0]), r(s[len(s)-1]), len(s))
}

func spreadFloat(f []float64) string {
	s := slices.Clone(f)
	slices.Sort(s)
	return fmt.Sprintf("median %.0f (min %.0f, max %.0f)", s[len(s)/2], s[0], s[len(s)-1])
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// shortDir is a temporary directory whose path leaves room for the VMs'
// unix sockets (108 bytes).
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "kib-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// rssKiB is a process's resident memory.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(rest), &kb)
			return kb
		}
	}
	return 0
}
