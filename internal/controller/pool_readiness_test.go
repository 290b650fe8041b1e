package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/guestsim"
)

// A pool with spec.readiness GuestAgent binds only members whose guest
// agent answers the node's ping (GuestAgentReady), where a pool with the
// default readiness binds any Running member: with every agent hung, a
// claim on the first waits and says why, a claim on the second binds; once
// the agents answer again, the first binds too.
func TestPoolReadinessGuestAgent(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	state := t.TempDir()
	simBackend, err := sim.New(sim.Options{StateDir: filepath.Join(state, "instances")})
	if err != nil {
		t.Fatal(err)
	}
	guests := guestsim.New(t, simBackend)
	guests.SetAgentsSilent(true)
	// A short tick: the node pings each Running Machine's agent every tick.
	runAgentWith(t, env, ns, "a", "10.90.7.0/24", 8, "8Gi", guests, state, 200*time.Millisecond)
	startControllers(t, env, ns, Options{})

	agentPool := createPool(t, env, ns, "agentpool", 0)
	patch := client.MergeFrom(agentPool.DeepCopy())
	agentPool.Spec.Readiness = kaironv1.PoolReadinessGuestAgent
	agentPool.Spec.Replicas = ptr.To(int32(1))
	if err := env.Client.Patch(context.Background(), agentPool, patch); err != nil {
		t.Fatal(err)
	}
	if def := createPool(t, env, ns, "plain", 1); def.Spec.Readiness != kaironv1.PoolReadinessRunning {
		t.Errorf("a pool's spec.readiness defaults to %q, want Running", def.Spec.Readiness)
	}

	// The gated pool's member runs, but its agent does not answer.
	eventually(t, "agentpool's member Running with GuestAgentReady False", func() (bool, string) {
		warm, _ := poolMachines(t, env, ns, "agentpool")
		if len(warm) != 1 {
			return false, fmt.Sprintf("%d warm members", len(warm))
		}
		cond := meta.FindStatusCondition(warm[0].Status.Conditions, kaironv1.ConditionGuestAgentReady.String())
		return warm[0].Status.Phase == kaironv1.MachineRunning && cond != nil && cond.Status == metav1.ConditionFalse &&
			cond.Reason == kaironv1.GuestAgentReasonNotAnswering, fmtJSON(warm[0].Status)
	})
	createClaim(t, env, ns, "gated", "agentpool")
	createClaim(t, env, ns, "ungated", "plain")
	waitClaimBound(t, env, ns, "ungated")
	waitClaimPending(t, env, ns, "gated", kaironv1.ClaimReasonWaitingForWarmMachine,
		`no Running warm machine with an answering guest agent in pool "agentpool" (1 warming)`)
	if p := getPool(t, env, ns, "agentpool"); p.Status.ReadyWarm != 0 || p.Status.Warm != 1 {
		t.Errorf("agentpool status %s: want 1 warm, 0 ready", fmtJSON(p.Status))
	}

	guests.SetAgentsSilent(false)
	bound := waitClaimBound(t, env, ns, "gated")
	m := getMachine(t, env, ns, bound.Status.MachineName)
	if !meta.IsStatusConditionTrue(m.Status.Conditions, kaironv1.ConditionGuestAgentReady.String()) {
		t.Errorf("bound member's conditions %s: want GuestAgentReady True", fmtJSON(m.Status.Conditions))
	}
}
