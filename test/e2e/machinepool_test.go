package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// boundLine is kaironctl claim's output, exactly.
var boundLine = regexp.MustCompile(`^machineclaim/(agents-claim-[0-9a-f]{6}) bound to machine/([a-z0-9.-]+) in ([0-9]+)ms\n$`)

// The warm-pool path with real VMs: the example pool boots its members,
// `kaironctl claim` binds one that is already Running and prints the bound
// line, the claimed guest answers on its address, and `kaironctl release`
// deletes it again.
func TestPoolClaimGetsARunningVM(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	// Two warm members, job-42's Machine and ours: four 1-vCPU Machines at
	// once, plus room for a replacement booting.
	node := startPoolNode(t, env, ns, "e2e-pool", 6, "3Gi")
	netNS, state := node.netNS, node.state

	// The example as a user applies it: pool "agents" and claim "job-42".
	example, err := filepath.Abs("../../examples/machinepool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env.Kubectl(t, "-n", ns, "apply", "-f", example)

	warm := func() (bool, string) {
		list := &kaironv1.MachineList{}
		if err := env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{
			kaironv1.LabelMachinePool: "agents", kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
		}); err != nil {
			return false, err.Error()
		}
		running := 0
		var seen []string
		for _, m := range list.Items {
			if m.Status.Phase == kaironv1.MachineRunning {
				running++
			}
			seen = append(seen, m.Name+"="+string(m.Status.Phase))
		}
		return running == 2, fmt.Sprintf("%d Running of warm members %v", running, seen)
	}
	testenv.Eventually(t, 4*time.Minute, "2 Running warm members of pool agents", warm)

	// Claim one from the command line, as the guide shows.
	start := time.Now()
	cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns,
		"claim", "agents", "--label", "team=ml", "--ttl", "1h")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || stderr.Len() != 0 {
		t.Fatalf("kaironctl claim agents: %v\nstdout: %q\nstderr: %q", err, stdout.String(), stderr.String())
	}
	took := time.Since(start)
	match := boundLine.FindStringSubmatch(stdout.String())
	if match == nil {
		t.Fatalf("kaironctl claim printed %q, want %q", stdout.String(), boundLine)
	}
	claimName, machineName := match[1], match[2]
	millis, _ := strconv.ParseInt(match[3], 10, 64)
	t.Logf("%s (kaironctl returned after %s)", strings.TrimSpace(stdout.String()), took.Round(time.Millisecond))

	claim := &kaironv1.MachineClaim{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: claimName}, claim); err != nil {
		t.Fatal(err)
	}
	if claim.Status.Phase != kaironv1.ClaimBound || claim.Status.MachineName != machineName || claim.Status.BindMillis != millis {
		t.Errorf("claim status %+v does not match the printed line", claim.Status)
	}
	if claim.Spec.PoolName != "agents" || claim.Spec.Labels["team"] != "ml" || claim.Spec.TTLSeconds == nil || *claim.Spec.TTLSeconds != 3600 {
		t.Errorf("claim spec %+v, want pool agents, label team=ml, ttl 3600", claim.Spec)
	}

	m := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: machineName}, m); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"team":                     "ml",
		kaironv1.LabelPoolState:    kaironv1.PoolStateClaimed,
		kaironv1.LabelMachineClaim: claimName,
		kaironv1.LabelMachinePool:  "agents",
	} {
		if got := m.Labels[k]; got != want {
			t.Errorf("claimed machine label %s=%q, want %q (labels %v)", k, got, want, m.Labels)
		}
	}
	// Warm means booted: the Machine was Running before the claim, so the
	// claim did not wait for a boot.
	if m.Status.Phase != kaironv1.MachineRunning || len(m.Status.Addresses) == 0 {
		t.Fatalf("claimed machine is %s with addresses %v, want Running with an address", m.Status.Phase, m.Status.Addresses)
	}
	if m.CreationTimestamp.Time.After(claim.CreationTimestamp.Time) {
		t.Errorf("claimed machine %s was created after the claim: a cold boot, not a warm one", machineName)
	}
	t.Logf("bound in %dms; the machine had booted in %dms", millis, m.Status.BootMillis)

	address := m.Status.Addresses[0].Address
	page, err := getInNetNS(netNS, "http://"+address+":8080/")
	if err != nil || !strings.Contains(page, "kairon guest "+machineName) {
		t.Fatalf("claimed guest at %s did not answer: %v %q", address, err, page)
	}
	if _, ok := vmProcesses(t, state)[ns+"/"+machineName]; !ok {
		t.Errorf("no QEMU process for %s/%s", ns, machineName)
	}

	// Releasing the claim (reclaimPolicy Delete) deletes the Machine and its VM.
	out, err := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns,
		"release", claimName, "--timeout", "2m").CombinedOutput()
	if want := "machineclaim/" + claimName + " released\nmachine/" + machineName + " deleted\n"; err != nil || string(out) != want {
		t.Fatalf("kaironctl release: %v\n%q\nwant %q", err, out, want)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: machineName}, m); !apierrors.IsNotFound(err) {
		t.Errorf("released machine still there: %v", err)
	}
	if _, ok := vmProcesses(t, state)[ns+"/"+machineName]; ok {
		t.Errorf("QEMU process for %s/%s left after release", ns, machineName)
	}

	// Tidy up so no VM outlives the test: job-42's Machine goes with its
	// claim, the warm members with the pool.
	env.Kubectl(t, "-n", ns, "delete", "-f", example, "--wait=true", "--timeout=2m")
	testenv.Eventually(t, 2*time.Minute, "every Machine deleted", func() (bool, string) {
		list := &kaironv1.MachineList{}
		_ = env.Client.List(ctx, list, client.InNamespace(ns))
		var left []string
		for _, m := range list.Items {
			left = append(left, m.Name)
		}
		return len(left) == 0, fmt.Sprint(left)
	})
	if vms := vmProcesses(t, state); len(vms) != 0 {
		t.Errorf("VMs left after deleting the pool and claims: %v", vms)
	}
}

// kubectlQuiet runs kubectl for diagnostics, returning whatever it printed.
// jsonpathQuiet reads what kubectl get -o jsonpath would print, in this
// process (the tests poll with it); an error reads as its text, as in
// kubectlQuiet.
func jsonpathQuiet(env *testenv.Env, q testenv.Query, template string) string {
	out, err := testenv.JSONPath(env.Kubeconfig, q, template)
	if err != nil {
		return err.Error()
	}
	return out
}

func kubectlQuiet(env *testenv.Env, args ...string) string {
	out, err := exec.Command(filepath.Join(env.BinDir, "kubectl"), append([]string{"--kubeconfig", env.Kubeconfig}, args...)...).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return err.Error()
	}
	return string(out)
}
