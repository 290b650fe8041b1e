package node

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// fenceOnRejoin runs when the agent starts, before it reports its Node
// Ready, renews its Lease or reconciles a single Machine: it destroys
// every VM still running here whose Machine no longer exists, runs on
// another node now, waits to be placed again, or was recreated under the
// same name after the VM started. That is what a fence leaves behind
// (kaironctl fence: the operator said the node was down, and Kairon
// brought its Machines back elsewhere, or deleted them), but the rule holds
// after any absence: a VM whose Machine is elsewhere must not run twice.
// The Machine reconciler would tear these down too, but only once it got
// to them, after the node was Ready again; here nothing else happens first.
// A VM a Running migration through this node still needs is left alone.
func (a *Agent) fenceOnRejoin(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("rejoin-fence")
	instances, err := a.opts.Backend.List(ctx)
	if err != nil {
		return fmt.Errorf("listing the VMs: %w", err)
	}
	reader := a.mgr.GetAPIReader()
	var node *corev1.Node
	var errs []error
	for _, inst := range instances {
		key, ok := machineKey(inst.Name)
		if !ok || inst.ID != instanceID(key.Namespace, key.Name) {
			continue // not a Machine's VM
		}
		why, err := a.staleBecause(ctx, reader, key, inst.StartedAt.Unix())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if why == "" {
			continue
		}
		if held, err := a.migrationHoldsIn(ctx, reader, key.Namespace, key.Name); err != nil || held {
			errs = append(errs, err)
			continue
		}
		a.boots.forget(inst.ID)
		if err := errors.Join(a.teardown(ctx, inst.ID), a.removeSnapshot(inst.ID)); err != nil {
			errs = append(errs, fmt.Errorf("destroying the stale VM of %s: %w", key, err))
			continue
		}
		message := fmt.Sprintf("destroyed the VM of machine %s before reporting Ready: %s", key, why)
		logger.Info("Destroyed a stale VM", "machine", klog.KRef(key.Namespace, key.Name), "why", why)
		if node == nil {
			node = &corev1.Node{}
			if err := reader.Get(ctx, client.ObjectKey{Name: a.opts.NodeName}, node); err != nil {
				node = nil
			}
		}
		if node != nil {
			// The Machine as the related object: events of one reason on
			// one Node are otherwise folded into one series, one message.
			related := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			a.recorder.Eventf(node, related, corev1.EventTypeWarning, kaironv1.EventReasonStaleVMDestroyed, "RejoinFence", "%s", message)
		}
	}
	if node != nil && rules.NodeFenced(node) {
		logger.Info("The node is fenced: the scheduler places nothing here until kaironctl recover " + a.opts.NodeName)
	}
	return errors.Join(errs...)
}

// staleBecause says why a VM started at startedUnix (seconds) for the
// Machine key must not run here, "" when it may.
func (a *Agent) staleBecause(ctx context.Context, reader client.Reader, key types.NamespacedName, startedUnix int64) (string, error) {
	var m kaironv1.Machine
	err := reader.Get(ctx, key, &m)
	switch {
	case apierrors.IsNotFound(err):
		return "its Machine no longer exists", nil
	case err != nil:
		return "", fmt.Errorf("reading machine %s: %w", key, err)
	case m.Spec.NodeName == "":
		return "its Machine waits to be placed again", nil
	case m.Spec.NodeName != a.opts.NodeName:
		return "its Machine runs on node " + m.Spec.NodeName + " now", nil
	case m.CreationTimestamp.Unix() > startedUnix:
		// creationTimestamp has whole seconds: a Machine created in the
		// second its VM started still counts as this VM's.
		return "its Machine was recreated after the VM started", nil
	}
	return "", nil
}
