package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// guestPingTimeout bounds the ping behind a Machine's GuestAgentReady
// condition. An agent that misses it has its channel dropped, so that the
// next ping dials again and says Hello: an agent started again in the
// guest answers only a connection that begins with one.
const guestPingTimeout = 3 * time.Second

// observeGuestAgent keeps the Machine's GuestAgentReady condition on a
// backend with a guest agent channel: each tick pings the agent of a
// Running Machine. A MachinePool with spec.readiness GuestAgent binds only
// members where it is True.
func (a *Agent) observeGuestAgent(ctx context.Context, machine *kaironv1.Machine, id string) {
	ch, ok := a.opts.Backend.(agentChannel)
	if !ok {
		return
	}
	cond := metav1.Condition{
		Type: kaironv1.ConditionGuestAgentReady.String(), Status: metav1.ConditionTrue,
		Reason: kaironv1.GuestAgentReasonAnswered, Message: "the guest agent answered a ping",
		ObservedGeneration: machine.Generation,
	}
	switch {
	case machine.Status.Phase != kaironv1.MachineRunning:
		if meta.FindStatusCondition(machine.Status.Conditions, cond.Type) == nil {
			return
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, kaironv1.GuestAgentReasonNotRunning, fmt.Sprintf("the Machine is %s", machine.Status.Phase)
	default:
		status, err := pingGuest(ctx, ch.AgentSocket(id))
		if err != nil {
			cond.Status, cond.Reason = metav1.ConditionFalse, kaironv1.GuestAgentReasonNotAnswering
			cond.Message = "the guest agent does not answer: " + client.CleanText(err.Error(), 256)
		} else {
			a.observeMainProcess(machine, status.Main) // main_process.go
		}
	}
	meta.SetStatusCondition(&machine.Status.Conditions, cond)
}

// pingGuest pings the guest agent at the socket path over the node's shared
// channel to it, and returns what it reports of the guest.
func pingGuest(ctx context.Context, path string) (wire.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, guestPingTimeout)
	defer cancel()
	c, err := guestChannels.get(ctx, path)
	if err != nil {
		return wire.Status{}, err
	}
	status, err := c.Status(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		_ = c.Close()
	}
	return status, err
}
