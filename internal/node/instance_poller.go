package node

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
)

// pollInstances asks the backend what runs and wakes the reconciler for every
// instance whose phase changed, appeared or vanished. The first pass wakes it
// for every instance, which is how VMs left by an earlier agent are adopted —
// or stopped, when their Machine is gone. It also wakes it for every VM
// the last agent suspended, whose Machine may be gone meanwhile.
func (a *Agent) pollInstances(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("instances")
	for _, name := range a.suspendedMachines() {
		a.wake(name)
	}
	seen := map[string]backend.Phase{}
	ticker := time.NewTicker(a.opts.InstancePollInterval)
	defer ticker.Stop()
	for {
		instances, err := a.opts.Backend.List(ctx)
		if err != nil {
			logger.Error(err, "listing instances")
		} else {
			current := map[string]backend.Phase{}
			for _, instance := range instances {
				current[instance.Name] = instance.Phase
				if old, ok := seen[instance.Name]; !ok || old != instance.Phase {
					a.wake(instance.Name)
				}
			}
			for name := range seen {
				if _, ok := current[name]; !ok {
					a.wake(name)
				}
			}
			seen = current
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

func (a *Agent) wake(instanceName string) {
	key, ok := machineKey(instanceName)
	if !ok {
		return
	}
	machine := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case a.instanceEvents <- event.TypedGenericEvent[*kaironv1.Machine]{Object: machine}:
	default: // the reconciler is behind; the tick will catch up
	}
}
