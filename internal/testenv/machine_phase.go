package testenv

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// WaitMachinePhase waits until the Machine at key reports phase want and
// returns it as last read. timeout is the caller's upper bound: a sim agent
// moves a Machine in seconds, a real guest boots in minutes. A failure
// shows the phase and message the Machine last had.
func (e *Env) WaitMachinePhase(t TB, key client.ObjectKey, want kaironv1.MachinePhase, timeout time.Duration) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{}
	Eventually(t, timeout, "machine "+key.String()+" "+string(want), func() (bool, string) {
		if err := e.Client.Get(context.Background(), key, m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == want, string(m.Status.Phase) + ": " + m.Status.Message
	})
	return m
}
