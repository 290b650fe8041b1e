package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// A claim storm survives a kairon-controller restart in its middle: 100
// claims arrive at a pool of 30 warm members, the controller is stopped
// once a third of them are bound (binds, Machine patches and status writes
// in flight), and a new one takes over from what the API server holds.
// Every claim ends Bound exactly once: none is lost, none names two
// Machines, no Machine serves two claims.
func TestClaimStormSurvivesControllerRestart(t *testing.T) {
	const warm, claims = 30, 100
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	history := watchClaimBinds(t, env, ns)
	for i := range 2 {
		runSimAgent(t, env, ns, fmt.Sprintf("r%d", i), fmt.Sprintf("10.92.%d.0/24", i), 128, "64Gi", simBootDelay)
	}
	stop := startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", warm)
	testenv.Eventually(t, 5*time.Minute, "30 Running warm members", func() (bool, string) {
		w, _ := poolMachines(t, env, ns, "agents")
		return len(w) == warm && countRunning(w) == warm, fmt.Sprintf("%d warm, %d Running", len(w), countRunning(w))
	})

	boundCount := func() (int, []kaironv1.MachineClaim) {
		var list kaironv1.MachineClaimList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range list.Items {
			if c.Status.Phase == kaironv1.ClaimBound {
				n++
			}
		}
		return n, list.Items
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < claims; i += 8 {
				c := &kaironv1.MachineClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("storm-%03d", i)},
					Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
				}
				if err := env.Client.Create(context.Background(), c); err != nil {
					t.Errorf("creating claim %s: %v", c.Name, err)
				}
			}
		})
	}
	testenv.Eventually(t, 5*time.Minute, "a third of the claims bound", func() (bool, string) {
		n, _ := boundCount()
		return n >= claims/3, fmt.Sprintf("%d bound", n)
	})
	stop()
	atStop, _ := boundCount()
	t.Logf("controller stopped with %d/%d claims bound", atStop, claims)
	wg.Wait()
	startControllers(t, env, ns, Options{})

	var all []kaironv1.MachineClaim
	testenv.Eventually(t, 5*time.Minute, "every claim bound after the restart", func() (bool, string) {
		var n int
		n, all = boundCount()
		return n == claims && len(all) == claims, fmt.Sprintf("%d/%d bound", n, len(all))
	})
	if atStop == claims {
		t.Errorf("every claim was bound before the restart: the restart tested nothing")
	}
	checkBoundOnce(t, env, ns, all, history)
}
