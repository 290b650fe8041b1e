package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// Kairon's VMs run outside every pod (docs/design/node-agent-lifecycle.md),
// so neither kube-scheduler nor the kubelet sees their memory. A booking pod
// is a pause container bound to the Machine's node that requests what the
// VM takes: kube-scheduler then places nothing into that room, the kubelet
// counts it, and Kairon's scheduler leaves the pod out of its own sum
// because it counts the Machine (rules.ChargePods). docs/design/capacity.md
// explains the choice.

const (
	// DefaultCapacityBookingImage is the booking pods' image: a container
	// that does nothing, as small as one gets.
	DefaultCapacityBookingImage = "registry.k8s.io/pause:3.10"
	// DefaultCapacityBookingOverhead is what a VM takes beyond its guest's
	// memory: QEMU's own code, device emulation and buffers.
	DefaultCapacityBookingOverhead = "64Mi"

	// bookingRetryDelay is how long a booking pod the kubelet rejected is
	// left in place (its reason visible) before a new one is tried.
	bookingRetryDelay = time.Minute

	// bookingMachineIndex indexes booking pods by the name of the Machine
	// that controls them.
	bookingMachineIndex = "kairon.zyvor.dev/booking-machine"

	bookingContainerName = "booking"
	// pauseUser is the user registry.k8s.io/pause runs as; naming it lets
	// the pod pass the restricted Pod Security Standard.
	pauseUser = 65535
)

// CapacityBookingOptions configure booking pods.
type CapacityBookingOptions struct {
	// Enabled creates a booking pod for every placed Machine. Off where
	// no kubelet runs the nodes (kairon-local).
	Enabled bool
	// Image is the booking container's; empty means
	// DefaultCapacityBookingImage.
	Image string
	// Overhead is added to every booking pod's memory; nil means
	// DefaultCapacityBookingOverhead.
	Overhead *resource.Quantity
	// PriorityClassName is the booking pods' priority class; empty means
	// none (priority 0).
	PriorityClassName string
}

// BindFlags registers the -capacity-booking-* flags on fs.
func (o *CapacityBookingOptions) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "capacity-booking-pods", false, "book every placed Machine's CPU and memory (plus -capacity-booking-overhead) with the kubelet and kube-scheduler through a pause pod bound to its node (docs/design/capacity.md); needs a kubelet on Kairon's nodes")
	fs.StringVar(&o.Image, "capacity-booking-image", DefaultCapacityBookingImage, "image of the booking pods' only container")
	fs.Func("capacity-booking-overhead", "memory a VM takes beyond its guest's, added to each booking pod (QEMU itself), as a quantity (default "+DefaultCapacityBookingOverhead+")", func(s string) error {
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return fmt.Errorf("-capacity-booking-overhead: %w", err)
		}
		if q.Sign() < 0 {
			return fmt.Errorf("-capacity-booking-overhead must not be negative, got %s", s)
		}
		o.Overhead = &q
		return nil
	})
	fs.StringVar(&o.PriorityClassName, "capacity-booking-priority-class", "", "priority class of the booking pods (empty: none); it must exist, and system-node-critical is only admitted where a quota allows it")
}

func (o CapacityBookingOptions) image() string {
	if o.Image == "" {
		return DefaultCapacityBookingImage
	}
	return o.Image
}

func (o CapacityBookingOptions) overhead() resource.Quantity {
	if o.Overhead == nil {
		return resource.MustParse(DefaultCapacityBookingOverhead)
	}
	return o.Overhead.DeepCopy()
}

// CapacityBookingReconciler keeps one booking pod per placed Machine on its
// node, and one on a Running migration's target, so the target's room is
// booked before the switch.
type CapacityBookingReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Options  CapacityBookingOptions
	// now is the clock of the retry delay; nil means time.Now.
	now func() time.Time
}

// SetupWithManager registers the booking controller with mgr.
func (r *CapacityBookingReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.now == nil {
		r.now = time.Now
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, bookingMachineIndex, bookingMachineName); err != nil {
		return fmt.Errorf("indexing booking pods by Machine: %w", err)
	}
	migrationToMachine := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		mig, ok := o.(*kaironv1.MachineMigration)
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: mig.Namespace, Name: mig.Spec.MachineName}}}
	})
	return builder.ControllerManagedBy(mgr).
		Named("capacity-booking").
		For(&kaironv1.Machine{}, builder.WithPredicates(machinePlacementChanged())).
		Owns(&corev1.Pod{}).
		Watches(&kaironv1.MachineMigration{}, migrationToMachine).
		Complete(requeue.UntilStopped(r))
}

func bookingMachineName(o client.Object) []string {
	if pod, ok := o.(*corev1.Pod); ok && rules.IsBookingPod(pod) {
		return []string{metav1.GetControllerOf(pod).Name}
	}
	return nil
}

// Reconcile makes the booking pods of one Machine match where it holds room.
func (r *CapacityBookingReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var machine *kaironv1.Machine
	var m kaironv1.Machine
	switch err := r.Client.Get(ctx, req.NamespacedName, &m); {
	case apierrors.IsNotFound(err):
		// Gone: its pods go too (the garbage collector would, but not
		// where none runs).
	case err != nil:
		return reconcile.Result{}, err
	default:
		machine = &m
	}
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(req.Namespace), client.MatchingFields{bookingMachineIndex: req.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing booking pods: %w", err)
	}
	nodes, err := r.bookedNodes(ctx, machine)
	if err != nil {
		return reconcile.Result{}, err
	}

	var errs []error
	var retryAfter time.Duration
	have := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.DeletionTimestamp != nil {
			have[pod.Spec.NodeName] = true // going; its replacement comes after
			continue
		}
		want := machine != nil && metav1.IsControlledBy(pod, machine) && nodes[pod.Spec.NodeName] && r.podMatches(pod, machine)
		if want && pod.Status.Phase == corev1.PodFailed {
			errs = append(errs, r.reportRejected(ctx, machine, pod))
			if wait := pod.CreationTimestamp.Add(bookingRetryDelay).Sub(r.now()); wait > 0 {
				have[pod.Spec.NodeName] = true
				if retryAfter == 0 || wait < retryAfter {
					retryAfter = wait
				}
				continue
			}
			want = false // replaced below, once gone
		}
		if !want {
			errs = append(errs, r.deletePod(ctx, machine, pod))
			have[pod.Spec.NodeName] = true
			continue
		}
		have[pod.Spec.NodeName] = true
		if pod.Status.Phase == corev1.PodRunning && pod.Spec.NodeName == machine.Spec.NodeName {
			errs = append(errs, r.setBooked(ctx, machine, pod))
		}
	}
	for node := range nodes {
		if !have[node] {
			errs = append(errs, r.createPod(ctx, machine, node))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: retryAfter}, nil
}

// bookedNodes are the nodes m holds room on (rules.HoldsNodeResources):
// its own, and the target of a Running migration before the switch, as
// rules.ChargeNodes counts them.
func (r *CapacityBookingReconciler) bookedNodes(ctx context.Context, m *kaironv1.Machine) (map[string]bool, error) {
	nodes := map[string]bool{}
	if m == nil || !rules.HoldsNodeResources(m) {
		return nodes, nil
	}
	nodes[m.Spec.NodeName] = true
	var migrations kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &migrations, client.InNamespace(m.Namespace)); err != nil {
		return nil, fmt.Errorf("listing machine migrations: %w", err)
	}
	for _, mig := range migrations.Items {
		if mig.Spec.MachineName == m.Name && mig.Status.Phase == kaironv1.MigrationRunning && mig.Status.TargetNode != "" {
			nodes[mig.Status.TargetNode] = true
		}
	}
	return nodes, nil
}

// bookingRequests is what m's booking pod asks for: the guest's vCPUs and
// memory plus the per-VM overhead, as requests and limits alike, so the pod
// is Guaranteed and the last the kubelet evicts.
func (r *CapacityBookingReconciler) bookingRequests(m *kaironv1.Machine) corev1.ResourceList {
	memory := rules.MachineMemory(m)
	memory.Add(r.Options.overhead())
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(rules.MachineCPU(m)), resource.DecimalSI),
		corev1.ResourceMemory: memory,
	}
}

// podMatches says whether pod still books what m takes; a pod booked for
// another size or image is replaced (a pod's requests cannot be edited).
func (r *CapacityBookingReconciler) podMatches(pod *corev1.Pod, m *kaironv1.Machine) bool {
	if len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Image != r.Options.image() {
		return false
	}
	got, want := pod.Spec.Containers[0].Resources.Requests, r.bookingRequests(m)
	return got.Cpu().Cmp(*want.Cpu()) == 0 && got.Memory().Cmp(*want.Memory()) == 0
}

// bookingPodName is stable per Machine and node, so a create that raced
// another one fails with AlreadyExists instead of booking twice.
func bookingPodName(machine, node string) string {
	sum := sha256.Sum256([]byte(node))
	suffix := "-booking-" + hex.EncodeToString(sum[:])[:10]
	const maxName = 253
	if len(machine)+len(suffix) > maxName {
		machine = machine[:maxName-len(suffix)]
	}
	return machine + suffix
}

func (r *CapacityBookingReconciler) bookingPod(m *kaironv1.Machine, node string) *corev1.Pod {
	list := r.bookingRequests(m)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: m.Namespace,
			Name:      bookingPodName(m.Name, node),
			Labels:    map[string]string{rules.LabelCapacityBooking: "true"},
			// Controller, not blocking: the Machine's deletion does not
			// wait for its pod, and no finalizers permission is needed.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: kaironv1.GroupVersion.String(),
				Kind:       "Machine",
				Name:       m.Name,
				UID:        m.UID,
				Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			NodeName:          node,
			PriorityClassName: r.Options.PriorityClassName,
			Containers: []corev1.Container{{
				Name:      bookingContainerName,
				Image:     r.Options.image(),
				Resources: corev1.ResourceRequirements{Requests: list, Limits: list.DeepCopy()},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             ptr.To(true),
					RunAsUser:                ptr.To[int64](pauseUser),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			// The VM stays whatever the node's taints say; so does its booking.
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
		},
	}
}

func (r *CapacityBookingReconciler) createPod(ctx context.Context, m *kaironv1.Machine, node string) error {
	pod := r.bookingPod(m, node)
	err := r.Client.Create(ctx, pod)
	if apierrors.IsAlreadyExists(err) {
		// A pod of a previous Machine of that name, still going, or our
		// own create the cache has not shown: the pod's events bring
		// this Machine back.
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating booking pod %s on node %s: %w", pod.Name, node, err)
	}
	ctrl.LoggerFrom(ctx).Info("Booked machine's capacity", "machine", klog.KObj(m), "node", node, "pod", pod.Name,
		"cpu", pod.Spec.Containers[0].Resources.Requests.Cpu().String(), "memory", rules.FormatMemory(*pod.Spec.Containers[0].Resources.Requests.Memory()))
	return nil
}

func (r *CapacityBookingReconciler) deletePod(ctx context.Context, m *kaironv1.Machine, pod *corev1.Pod) error {
	err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting booking pod %s: %w", pod.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("Released booked capacity", "machine", klog.KRef(pod.Namespace, metav1.GetControllerOf(pod).Name), "node", pod.Spec.NodeName, "pod", pod.Name, "machineGone", m == nil)
	return nil
}

// reportRejected tells the Machine's owner that the kubelet refused its
// booking pod: the VM runs, but Kubernetes does not count it, and the node
// is fuller than either scheduler thought.
func (r *CapacityBookingReconciler) reportRejected(ctx context.Context, m *kaironv1.Machine, pod *corev1.Pod) error {
	why := pod.Status.Reason
	if why == "" {
		why = "Failed"
	}
	message := fmt.Sprintf("node %s rejected booking pod %s: %s", pod.Spec.NodeName, pod.Name, why)
	if pod.Status.Message != "" {
		message += ": " + pod.Status.Message
	}
	changed, err := r.setCondition(ctx, m, metav1.ConditionFalse, kaironv1.CapacityBookingReasonRejected, message)
	if changed {
		ctrl.LoggerFrom(ctx).Info("Booking pod rejected", "machine", klog.KObj(m), "pod", pod.Name, "why", message)
		r.Recorder.Eventf(m, pod, corev1.EventTypeWarning, kaironv1.CapacityBookingReasonRejected, "Booking", "%s", message)
	}
	return err
}

func (r *CapacityBookingReconciler) setBooked(ctx context.Context, m *kaironv1.Machine, pod *corev1.Pod) error {
	_, err := r.setCondition(ctx, m, metav1.ConditionTrue, kaironv1.CapacityBookingReasonBooked,
		fmt.Sprintf("booking pod %s runs on node %s", pod.Name, pod.Spec.NodeName))
	return err
}

// setCondition writes the CapacityBooked condition when it differs,
// saying whether it did.
func (r *CapacityBookingReconciler) setCondition(ctx context.Context, m *kaironv1.Machine, status metav1.ConditionStatus, reason, message string) (bool, error) {
	if c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionCapacityBooked.String()); c != nil &&
		c.Status == status && c.Reason == reason && c.Message == message {
		return false, nil
	}
	desired := m.DeepCopy()
	meta.SetStatusCondition(&desired.Status.Conditions, metav1.Condition{
		Type:               kaironv1.ConditionCapacityBooked.String(),
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: desired.Generation,
	})
	// Locked: the node agent writes this status too. A conflict comes
	// back as an error and the Machine is looked at again.
	if err := patch.Status(ctx, r.Client, m, desired, patch.WithOptimisticLock()); err != nil {
		return false, err
	}
	return true, nil
}
