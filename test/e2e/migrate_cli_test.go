package e2e

import (
	"context"
	"regexp"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestKaironctlMigrateLive: `kaironctl migrate --strategy live --wait`
// through the real executor: kairon-controller and two sim agents that
// accept live migrations on loopback. The command returns once the
// Machine runs on the other node and says so.
func TestKaironctlMigrateLive(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	source, target := ns+"-src", ns+"-dst"
	startController(t, env)
	startSimAgent(t, env, source, "10.88.65.0/24", 2, "2Gi", "--migration-listen", "127.0.0.1:0")
	startSimAgent(t, env, target, "10.88.66.0/24", 2, "2Gi", "--migration-listen", "127.0.0.1:0")
	deleteMachinesAtEnd(t, env, ns)
	waitNodeReady(t, env, source)
	waitNodeReady(t, env, target)
	createMachinesOn(t, env, ns, source, nil, "worker")
	waitAllRunning(t, env, ns, source, 1)

	run := runKaironctl(t, env, 2*time.Minute, "-n", ns, "migrate", "worker", "--strategy", "live", "--wait", "--timeout", "1m")
	t.Logf("kaironctl migrate (exit %d, %s):\n%s%s", run.code, run.took, run.stdout, run.stderr)
	want := regexp.MustCompile(`^machinemigration ` + ns + `/worker-mig-[a-z0-9]{5} created: machine worker from node ` + source +
		` to the scheduler's choice \(live\)\nmachine ` + ns + `/worker moved from node ` + source + ` to node ` + target +
		` \(live\) in [0-9.]+m?s; the guest did not run for [1-9][0-9]*ms\n$`)
	if run.code != 0 || run.stderr != "" || !want.MatchString(run.stdout) {
		t.Errorf("kaironctl migrate: exit %d, stdout %q, stderr %q; want the move reported", run.code, run.stdout, run.stderr)
	}
	m := &kaironv1.Machine{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "worker"}, m); err != nil {
		t.Fatal(err)
	}
	if m.Spec.NodeName != target || m.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("machine on %q in phase %s, want Running on %s", m.Spec.NodeName, m.Status.Phase, target)
	}
}
