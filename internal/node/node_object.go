package node

import (
	"context"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
)

// nodeLabels are the labels the agent keeps on its Node so the scheduler and
// kaironctl know what runs there.
func (a *Agent) nodeLabels() map[string]string {
	labels := map[string]string{
		kaironv1.LabelNode:              "true",
		kaironv1.LabelNodeBackend:       a.opts.Backend.Name(),
		kaironv1.LabelNodeAcceleration:  a.opts.Backend.Acceleration(),
		corev1.LabelHostname:            a.opts.NodeName,
		kaironv1.LabelNodeSnapshotStore: a.opts.SnapshotStore,
	}
	if a.opts.Backend.Name() == "sim" {
		labels[kaironv1.LabelHollowNode] = "true"
	}
	return labels
}

// nodeAnnotations tell the controller how other agents reach this one: the
// port of the migration listener only. The controller pairs it with the
// Node's InternalIP into the endpoint annotation, which the agent never
// writes (an agent could otherwise point migrations at any host).
func (a *Agent) nodeAnnotations() map[string]string {
	annotations := map[string]string{}
	if port := a.migrationPort(); port != "" {
		annotations[kaironv1.AnnotationNodeMigrationPort] = port
	}
	return annotations
}

// syncNode creates or updates the Node object. A registered node also gets
// capacity, addresses, the console endpoint and a fresh Ready heartbeat.
func (a *Agent) syncNode(ctx context.Context, ready bool, reason, message string) (err error) {
	defer func() {
		if err == nil {
			a.lastNodeSync.Store(time.Now().UnixNano()) // readiness (health.go)
		}
	}()
	node := &corev1.Node{}
	// Read past the cache: this runs before the manager starts, and the agent
	// has no reason to cache every Node of the cluster.
	err = a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Name: a.opts.NodeName}, node)
	switch {
	case apierrors.IsNotFound(err) && a.opts.Register:
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.opts.NodeName, Labels: a.nodeLabels(), Annotations: a.nodeAnnotations()}}
		if err := a.client.Create(ctx, node); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		base := node.DeepCopy()
		if node.Labels == nil {
			node.Labels = map[string]string{}
		}
		for k, v := range a.nodeLabels() {
			node.Labels[k] = v
		}
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		delete(node.Annotations, kaironv1.AnnotationNodeMigrationPort)
		for k, v := range a.nodeAnnotations() {
			node.Annotations[k] = v
		}
		if err := a.client.Patch(ctx, node, client.MergeFrom(base)); err != nil {
			return err
		}
	}
	if !a.opts.Register {
		return nil
	}

	base := node.DeepCopy()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(a.opts.CPU, resource.DecimalSI),
		corev1.ResourceMemory: a.opts.Memory,
	}
	node.Status.Capacity = capacity
	node.Status.Allocatable = capacity
	host, port := a.endpoint()
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: host},
		{Type: corev1.NodeHostName, Address: a.opts.NodeName},
	}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	node.Status.NodeInfo.OperatingSystem = "linux"
	node.Status.NodeInfo.Architecture = "amd64"
	node.Status.NodeInfo.KubeletVersion = "kairon-node"
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	condition := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: now,
	}
	// Only Ready is the agent's: kairon-controller keeps KaironAgentReady
	// (from the agent's Lease) beside it.
	conditions := []corev1.NodeCondition{condition}
	for _, old := range node.Status.Conditions {
		switch {
		case old.Type != corev1.NodeReady:
			conditions = append(conditions, old)
		case old.Status == status:
			condition.LastTransitionTime = old.LastTransitionTime
			conditions[0] = condition
		}
	}
	node.Status.Conditions = conditions
	return patch.Status(ctx, a.client, base, node)
}

// endpoint is where the API server's node proxy reaches this agent.
func (a *Agent) endpoint() (string, int) {
	host, portText, err := net.SplitHostPort(a.listenAddr)
	if err != nil {
		return "127.0.0.1", 0
	}
	port, _ := strconv.Atoi(portText)
	if ip := net.ParseIP(host); host == "" || ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return host, port
}

// heartbeat keeps the Node Ready while the agent runs and marks it NotReady
// when the agent stops, after any VMs were suspended (Options.OnShutdown).
func (a *Agent) heartbeat(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("heartbeat")
	ticker := time.NewTicker(a.opts.HeartbeatInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			message := "kairon-node stopped; its VMs keep running"
			if a.opts.OnShutdown == ShutdownSuspend {
				message = "kairon-node stopped; its VMs were saved and resume when it starts again"
			}
			if err := a.syncNode(stopCtx, false, "AgentStopped", message); err != nil {
				logger.Error(err, "marking node NotReady")
			}
			return nil
		case <-ticker.C:
			if err := a.syncNode(ctx, true, "AgentReady", "kairon-node is running"); err != nil {
				logger.Error(err, "heartbeat")
			}
		}
	}
}
