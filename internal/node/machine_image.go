package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/images"
	"github.com/zyvor/kairon/internal/node/imagepull"
)

// A Machine whose spec.image is an OCI reference boots Kairon's default
// kernel and initramfs with the image, pulled and converted by the node,
// as its root filesystem. Before its VM starts, is restored, resumed or
// received, the node makes sure the image is here: the Machine waits
// Pending (reason PullingImage) while a pull runs in the background, and
// fails (ImagePullFailed) when the image cannot be had. The events are
// kubelet's: Pulling, Pulled, Failed.

// ImageStore is the node's OCI image store (internal/images).
type ImageStore interface {
	imagepull.Store
	// GC removes cached images, least recently used first, while the
	// cache is over its disk budget; never one inUse reports.
	GC(inUse func(digest string) bool) ([]string, error)
	// Lookup is the cached image of digest, without the network.
	Lookup(digest string) (imagepull.Image, bool)
}

// imagePollWait is how soon a Machine waiting for a pull looks again when
// nothing wakes it first (the pull's end does, through instanceEvents).
const imagePollWait = 2 * time.Second

// imageReference is the reference the node pulls for machine: spec.image
// pinned to the digest the Machine ran already (status.imageDigest), or,
// for a Machine restored from a MachineSnapshot, the digest the saved
// guest ran.
func (a *Agent) imageReference(ctx context.Context, machine *kaironv1.Machine) (string, error) {
	digest := machine.Status.ImageDigest
	if digest == "" && machine.Spec.RestoreFrom != nil {
		snap := &kaironv1.MachineSnapshot{}
		key := client.ObjectKey{Namespace: machine.Namespace, Name: machine.Spec.RestoreFrom.SnapshotName}
		if err := a.mgr.GetAPIReader().Get(ctx, key, snap); err == nil {
			digest = snap.Status.ImageDigest
		}
	}
	return imagepull.Pinned(machine.Spec.Image, digest)
}

// imageStatus asks the puller about machine's image, starting a pull when
// needed.
func (a *Agent) imageStatus(ctx context.Context, machine *kaironv1.Machine) (string, imagepull.Status) {
	ref, err := a.imageReference(ctx, machine)
	if err != nil {
		return machine.Spec.Image, imagepull.Status{State: imagepull.Failed, Err: err}
	}
	if a.imagePuller == nil {
		return ref, imagepull.Status{State: imagepull.Failed, Err: fmt.Errorf("node %s has no image store, so it cannot run OCI images (kairon-node --image-dir)", a.opts.NodeName)}
	}
	key := types.NamespacedName{Namespace: machine.Namespace, Name: machine.Name}
	pull := imagepull.Pull{Reference: ref, Credentials: a.pullCredentials(machine)}
	if len(machine.Spec.ImagePullSecrets) > 0 {
		names := make([]string, 0, len(machine.Spec.ImagePullSecrets))
		for _, s := range machine.Spec.ImagePullSecrets {
			names = append(names, s.Name)
		}
		pull.CredentialsKey = machine.Namespace + "/" + strings.Join(names, ",")
	}
	return ref, a.imagePuller.Get(pull, key)
}

// ensureImage is the step before a VM starts: true once machine's image
// (if it has an OCI one) is on the node, with status.imageDigest set.
// Otherwise it sets the Machine Pending or Failed and says how soon to
// look again. A fresh boot (no saved guest to bring back) takes what
// spec.image names now, as a new VM should: the digest of an earlier VM
// of the Machine may belong to another spec.image.
func (a *Agent) ensureImage(ctx context.Context, machine *kaironv1.Machine, fresh bool) (time.Duration, bool) {
	if !kaironv1.IsOCIImage(machine.Spec.Image) {
		return 0, true
	}
	if fresh {
		machine.Status.ImageDigest = ""
	}
	ref, st := a.imageStatus(ctx, machine)
	ready := meta.FindStatusCondition(machine.Status.Conditions, kaironv1.ConditionReady.String())
	waited := ready != nil && ready.Reason == kaironv1.MachineReasonPullingImage
	switch st.State {
	case imagepull.Ready:
		machine.Status.ImageDigest = st.Image.Digest
		if waited {
			a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonImagePulled,
				fmt.Sprintf("Successfully pulled image %q (%s) in %s", ref, st.Image.Digest, st.Took.Round(time.Millisecond)))
		} else {
			a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonImagePulled,
				fmt.Sprintf("Image %q (%s) is already on node %s", ref, st.Image.Digest, a.opts.NodeName))
		}
		return 0, true
	case imagepull.Failed:
		message := fmt.Sprintf("image %s cannot be used: %v", ref, st.Err)
		a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonImageFailed, message)
		setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonImagePullFailed, message)
		machine.Status.Addresses = nil
		return a.opts.Interval, false
	}
	message := fmt.Sprintf("pulling image %s on node %s", ref, a.opts.NodeName)
	if st.Started {
		a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonImagePulling, fmt.Sprintf("Pulling image %q", ref))
	}
	if st.Err != nil {
		message = fmt.Sprintf("pulling image %s on node %s, retrying after: %v", ref, a.opts.NodeName, st.Err)
		if !waited || ready.Message != message {
			a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonImageFailed, message)
		}
	}
	setPhase(machine, kaironv1.MachinePending, kaironv1.MachineReasonPullingImage, message)
	return imagePollWait, false
}

// awaitImage waits for machine's image where a VM must start now (a
// migration's target): it returns once the image is here, or why it
// cannot be.
func (a *Agent) awaitImage(ctx context.Context, machine *kaironv1.Machine) error {
	if !kaironv1.IsOCIImage(machine.Spec.Image) {
		return nil
	}
	for {
		ref, st := a.imageStatus(ctx, machine)
		switch st.State {
		case imagepull.Ready:
			machine.Status.ImageDigest = st.Image.Digest
			return nil
		case imagepull.Failed:
			return fmt.Errorf("image %s cannot be used on node %s: %w", ref, a.opts.NodeName, st.Err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for image %s on node %s: %w", ref, a.opts.NodeName, ctx.Err())
		case <-time.After(100 * time.Millisecond): // the pull runs in the background
		}
	}
}

// localImage is the file of the image machine runs (status.imageDigest),
// which ensureImage or awaitImage made sure of; an error if it is not on
// the node.
func (a *Agent) localImage(machine *kaironv1.Machine) (imagepull.Image, error) {
	digest := machine.Status.ImageDigest
	if digest == "" || a.opts.Images == nil {
		return imagepull.Image{}, transient(fmt.Errorf("image %s is not on node %s yet", machine.Spec.Image, a.opts.NodeName))
	}
	img, ok := a.opts.Images.Lookup(digest)
	if !ok {
		return imagepull.Image{}, transient(fmt.Errorf("image %s (%s) is not on node %s", machine.Spec.Image, digest, a.opts.NodeName))
	}
	return img, nil
}

// pullCredentials reads the Machine's pull secrets when a pull starts,
// straight from the API server: a node may get only its own Machines'
// secrets (the controller grants them), and never lists or watches any.
// A secret that is missing or not readable yet fails the pull for now,
// so it is retried: the user may be about to create it, or the grant be
// on its way. With Options.PullCredentialsURL the agent asks
// kairon-controller instead (pull_credentials.go).
func (a *Agent) pullCredentials(machine *kaironv1.Machine) imagepull.Credentials {
	if len(machine.Spec.ImagePullSecrets) == 0 {
		return nil
	}
	// Copied: the closure runs in the pull's goroutine while the
	// reconcile goes on writing machine.
	namespace, machineName := machine.Namespace, machine.Name
	names := make([]string, 0, len(machine.Spec.ImagePullSecrets))
	for _, s := range machine.Spec.ImagePullSecrets {
		names = append(names, s.Name)
	}
	if a.opts.PullCredentialsURL != "" {
		return func(ctx context.Context) ([][]byte, error) {
			c, err := NewPullCredentialsClient(a.opts.PullCredentialsURL, a.opts.PullCredentialsCAFile, a.mgr.GetConfig())
			if err != nil {
				return nil, imagepull.TransientError{Err: err}
			}
			defer c.http.CloseIdleConnections()
			return c.Fetch(ctx, namespace, machineName)
		}
	}
	return func(ctx context.Context) ([][]byte, error) {
		var configs [][]byte
		for i, name := range names {
			secret := &corev1.Secret{}
			err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret)
			if err != nil {
				if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
					return nil, imagepull.TransientError{Err: fmt.Errorf("spec.imagePullSecrets[%d] %q: %w", i, name, err)}
				}
				return nil, imagepull.TransientError{Err: err}
			}
			config, _, ok := images.DockerConfigOf(secret)
			if !ok {
				return nil, fmt.Errorf("spec.imagePullSecrets[%d] %q is of type %q; it must be %s", i, name, secret.Type, images.PullSecretTypes)
			}
			configs = append(configs, config)
		}
		return configs, nil
	}
}

// wakeMachine queues the Machine's reconcile (a pull it waited for ended).
func (a *Agent) wakeMachine(key types.NamespacedName) {
	machine := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case a.instanceEvents <- event.TypedGenericEvent[*kaironv1.Machine]{Object: machine}:
	default: // the reconciler is behind; imagePollWait catches up
	}
}

// imageGCInterval is how often the node collects cached images by
// default. An image pulled for a Machine, or found for one about to
// start, is kept for two intervals (at least minRecentKeep) whatever the
// Machines' statuses say: long enough for the VM to start and its status
// to name the digest.
const (
	imageGCInterval = time.Minute
	minRecentKeep   = 5 * time.Second
)

// collectImages removes cached images no Machine on this node and no
// MachineSnapshot needs, while the cache is over its budget.
func (a *Agent) collectImages(ctx context.Context) error {
	if a.opts.Images == nil {
		return nil
	}
	logger := log.FromContext(ctx).WithName("image-gc")
	ticker := time.NewTicker(a.imageGCInterval())
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		inUse, err := a.imagesInUse(ctx)
		if err != nil {
			logger.Error(err, "listing the images in use; nothing collected")
			continue
		}
		removed, err := a.opts.Images.GC(func(digest string) bool { return inUse[digest] })
		if err != nil {
			logger.Error(err, "collecting images")
		}
		if len(removed) > 0 {
			logger.Info("collected unused images", "digests", removed)
		}
	}
}

func (a *Agent) imageGCInterval() time.Duration {
	if a.opts.ImageGCInterval > 0 {
		return a.opts.ImageGCInterval
	}
	return imageGCInterval
}

// imagesInUse are the digests a Machine of this node runs or will run,
// and those every MachineSnapshot's saved guest ran (a restore anywhere
// may come here).
func (a *Agent) imagesInUse(ctx context.Context) (map[string]bool, error) {
	inUse := map[string]bool{}
	if a.imagePuller != nil {
		// Pulled for a VM that may not have started yet, nor written the
		// digest in its status.
		for _, d := range a.imagePuller.Recent(max(2*a.imageGCInterval(), minRecentKeep)) {
			inUse[d] = true
		}
	}
	var machines kaironv1.MachineList
	if err := a.client.List(ctx, &machines); err != nil { // the cache holds this node's only
		return nil, err
	}
	for _, m := range machines.Items {
		for _, d := range []string{m.Status.ImageDigest, imagepull.DigestOf(m.Spec.Image)} {
			if d != "" {
				inUse[d] = true
			}
		}
	}
	var snaps kaironv1.MachineSnapshotList
	if err := a.client.List(ctx, &snaps); err != nil {
		return nil, err
	}
	for _, s := range snaps.Items {
		if s.Status.ImageDigest != "" {
			inUse[s.Status.ImageDigest] = true
		}
	}
	return inUse, nil
}
