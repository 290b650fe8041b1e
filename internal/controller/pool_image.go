package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/images"
)

// A pool whose template names an OCI image by tag pins its members to one
// digest per template (docs/guides/machinepool.md): it asks the registry
// once what the tag names, records it in status.image with the template's
// hash, and creates every member with the reference pinned by that digest
// (pool_image_pin.go). Until it knows the digest it creates no member, so
// no member ever runs an unpinned image. The digest is asked again only
// for a new template hash; `kaironctl rollout restart machinepool` makes
// one by stamping the template, and the warm members are then replaced as
// for any template change (claimed ones are never touched).
//
// The registry is asked off the reconcile: a pool's reconcile runs one at
// a time for all pools, and a slow or unreachable registry must hold up
// none of them. A resolution runs in its own goroutine, bounded by
// imageResolveTimeout, and wakes its pool when done; a failure is retried
// with a doubling delay, as kubelet backs off an image pull.

const (
	// imageResolveTimeout bounds one resolution, retries of
	// go-containerregistry's own included.
	imageResolveTimeout = 30 * time.Second
	// imageRetryFirst and imageRetryMax: the delay after a failed
	// resolution doubles from the first to the most, kubelet's image pull
	// backoff.
	imageRetryFirst = 2 * time.Second
	imageRetryMax   = 5 * time.Minute
	// eventNoteLimit is the events API's limit on an event's note.
	eventNoteLimit = 1024
)

// poolImageState is what a pool's reconcile does about its image.
type poolImageState struct {
	// image is spec.image of new members: the template's built-in name,
	// or its OCI reference pinned by digest.
	image string
	// unknown: the digest is not known yet, and no member may be created.
	unknown bool
	// status is status.image; nil for a built-in image, and while the
	// current template's digest is not known.
	status *kaironv1.MachinePoolImage
	// cond is the ImageResolved condition; nil for a built-in image.
	cond *metav1.Condition
	// retryIn is when the pool is to look again (a retry due); 0 for
	// nothing to wait for.
	retryIn time.Duration
}

// poolImages are the resolutions of every pool's template image that this
// process has made or is making. It is a manager Runnable: Start gives
// the resolutions their context and, at the manager's stop, waits for
// those still running.
type poolImages struct {
	resolver ImageResolver
	// reader reads the pull secrets: never the cache, since the
	// controller may not list or watch Secrets.
	reader   client.Reader
	recorder events.EventRecorder
	now      func() time.Time
	// wake, when set, takes a pool whose resolution ended, so that its
	// reconcile runs at once (a channel source of its controller).
	wake chan event.TypedGenericEvent[*kaironv1.MachinePool]

	mu      sync.Mutex
	ctx     context.Context
	byPool  map[types.NamespacedName]*imageResolution
	running sync.WaitGroup
}

// imageResolution is one pool's resolution of one template.
type imageResolution struct {
	uid       types.UID
	hash, ref string
	running   bool
	result    *kaironv1.MachinePoolImage
	err       error
	attempts  int
	retryAt   time.Time
}

func newPoolImages(resolver ImageResolver, reader client.Reader, recorder events.EventRecorder) *poolImages {
	return &poolImages{
		resolver: resolver, reader: reader, recorder: recorder, now: time.Now,
		wake:   make(chan event.TypedGenericEvent[*kaironv1.MachinePool], 1024),
		byPool: map[types.NamespacedName]*imageResolution{},
	}
}

// Start implements manager.Runnable.
func (p *poolImages) Start(ctx context.Context) error {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
	<-ctx.Done()
	p.running.Wait()
	return nil
}

// forget drops what is known of pool's image: it is gone, or needs no
// resolution.
func (p *poolImages) forget(pool types.NamespacedName) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byPool, pool)
}

// pin decides pool's image for the template of hash; members are the
// pool's members, warm and claimed, whose spec.image records a digest
// already handed out for that template.
func (p *poolImages) pin(pool *kaironv1.MachinePool, hash string, members []*kaironv1.Machine) poolImageState {
	key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}
	ref := pool.Spec.Template.Spec.Image
	if !kaironv1.IsOCIImage(ref) {
		p.forget(key)
		return poolImageState{image: ref}
	}
	if digest, pinned := digestOf(ref); pinned {
		p.forget(key)
		return poolImageState{
			image:  ref,
			status: &kaironv1.MachinePoolImage{Reference: ref, Digest: digest, TemplateHash: hash},
			cond: imageCondition(pool, metav1.ConditionTrue, kaironv1.ImageReasonPinnedByDigest,
				fmt.Sprintf("spec.template.spec.image is pinned by digest %s; no registry is asked", digest)),
		}
	}
	if known := p.known(pool, key, hash, ref, members); known != nil {
		if image, err := pinImage(ref, known.Digest); err == nil {
			return poolImageState{
				image: image, status: known,
				cond: imageCondition(pool, metav1.ConditionTrue, kaironv1.ImageReasonResolved,
					fmt.Sprintf("%s resolved to %s; members run %s", ref, known.Digest, image)),
			}
		}
	}
	return p.resolve(pool, key, hash, ref)
}

// known is the digest already chosen for pool's template of hash: by this
// process, or as recorded in the pool's status, or, when the controller
// stopped between creating members and writing the status, as its members
// show. It is never asked again while the template stays the same.
func (p *poolImages) known(pool *kaironv1.MachinePool, key types.NamespacedName, hash, ref string, members []*kaironv1.Machine) *kaironv1.MachinePoolImage {
	p.mu.Lock()
	var result *kaironv1.MachinePoolImage
	if res := p.byPool[key]; res != nil && res.uid == pool.UID && res.hash == hash && res.ref == ref {
		result = res.result
	}
	p.mu.Unlock()
	if result != nil {
		return result.DeepCopy()
	}
	if s := pool.Status.Image; s != nil && s.TemplateHash == hash && s.Reference == ref && sha256Digest.MatchString(s.Digest) {
		return s.DeepCopy()
	}
	for _, m := range members {
		if m.Labels[kaironv1.LabelMachinePoolTemplateHash] != hash {
			continue
		}
		if digest, ok := strings.CutPrefix(m.Spec.Image, ref+"@"); ok && sha256Digest.MatchString(digest) {
			return &kaironv1.MachinePoolImage{Reference: ref, Digest: digest, TemplateHash: hash}
		}
	}
	return nil
}

// resolve reports the resolution of ref for pool's template of hash,
// starting it when none runs and no retry is pending.
func (p *poolImages) resolve(pool *kaironv1.MachinePool, key types.NamespacedName, hash, ref string) poolImageState {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := p.byPool[key]
	if res == nil || res.uid != pool.UID || res.hash != hash || res.ref != ref {
		// A resolution of an older template still running is left to
		// end; its result is dropped.
		res = &imageResolution{uid: pool.UID, hash: hash, ref: ref}
		p.byPool[key] = res
	}
	if now := p.now(); !res.running && (res.err == nil || !now.Before(res.retryAt)) {
		res.running = true
		ctx := p.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		p.running.Add(1)
		go p.run(ctx, pool.DeepCopy(), res)
	}
	if res.err != nil {
		// Still failed while it is retried, rather than Resolving
		// between two failures: one status write per attempt, not two.
		retryIn := imageResolveTimeout
		if !res.running {
			retryIn = max(res.retryAt.Sub(p.now()), time.Millisecond)
		}
		return poolImageState{unknown: true, retryIn: retryIn, cond: imageCondition(pool, metav1.ConditionFalse, kaironv1.ImageReasonResolveFailed,
			fmt.Sprintf("%v; no member is created until it resolves (%s so far, retried with backoff)", res.err, attempts(res.attempts)))}
	}
	// The wake ends the wait; the timeout is in case a wake is lost.
	return poolImageState{unknown: true, retryIn: imageResolveTimeout + time.Second, cond: imageCondition(pool, metav1.ConditionFalse, kaironv1.ImageReasonResolving,
		fmt.Sprintf("asking the registry for the digest of %s; no member is created until it answers", ref))}
}

// run resolves res for pool, records the outcome and wakes the pool.
func (p *poolImages) run(ctx context.Context, pool *kaironv1.MachinePool, res *imageResolution) {
	defer p.running.Done()
	ctx, cancel := context.WithTimeout(ctx, imageResolveTimeout)
	defer cancel()
	result, err := p.resolveOnce(ctx, pool, res.hash, res.ref)

	p.mu.Lock()
	res.running = false
	if err != nil {
		res.err = err
		res.attempts++
		res.retryAt = p.now().Add(imageRetryDelay(res.attempts))
	} else {
		res.result, res.err = result, nil
	}
	current := p.byPool[types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}] == res
	p.mu.Unlock()
	if !current {
		return
	}
	if p.recorder != nil {
		if err != nil {
			p.recorder.Eventf(pool, nil, corev1.EventTypeWarning, kaironv1.EventReasonFailedResolveImage, "ResolveImage", "%s", truncate(err.Error(), eventNoteLimit-8))
		} else {
			p.recorder.Eventf(pool, nil, corev1.EventTypeNormal, kaironv1.EventReasonResolvedImage, "ResolveImage",
				"Resolved %s to %s for template %s", truncate(res.ref, 600), result.Digest, res.hash)
		}
	}
	if p.wake != nil {
		select {
		case p.wake <- event.TypedGenericEvent[*kaironv1.MachinePool]{Object: pool}:
		default:
			// Full: the pool's own retry timer brings it back.
		}
	}
}

// resolveOnce asks the registry once, with the template's pull secrets.
func (p *poolImages) resolveOnce(ctx context.Context, pool *kaironv1.MachinePool, hash, ref string) (*kaironv1.MachinePoolImage, error) {
	keychain, missing, err := readPullSecrets(ctx, p.reader, pool.Namespace, pool.Spec.Template.Spec.ImagePullSecrets)
	if err != nil {
		return nil, fmt.Errorf("resolving image %s: reading spec.template.spec.imagePullSecrets: %w", ref, err)
	}
	digest, err := p.resolver.Resolve(ctx, ref, keychain)
	if err != nil {
		if len(missing) > 0 {
			err = fmt.Errorf("%w (spec.template.spec.imagePullSecrets names secrets that do not exist in namespace %s: %s)", err, pool.Namespace, strings.Join(missing, ", "))
		}
		var named *images.PullError
		if errors.As(err, &named) && named.Reference == ref {
			// Its message starts with the reference already.
			return nil, fmt.Errorf("resolving image %w", err)
		}
		return nil, fmt.Errorf("resolving image %s: %w", ref, err)
	}
	if _, err := pinImage(ref, digest); err != nil {
		return nil, fmt.Errorf("resolving image %s: the registry's answer: %w", ref, err)
	}
	return &kaironv1.MachinePoolImage{Reference: ref, Digest: digest, TemplateHash: hash, ResolvedAt: ptrTime(metav1.NewTime(p.now()).Rfc3339Copy())}, nil
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// imageRetryDelay is the wait after the attempts-th failure in a row.
func imageRetryDelay(attempts int) time.Duration {
	d := imageRetryFirst
	for i := 1; i < attempts && d < imageRetryMax; i++ {
		d *= 2
	}
	return min(d, imageRetryMax)
}

func imageCondition(pool *kaironv1.MachinePool, status metav1.ConditionStatus, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: kaironv1.ConditionImageResolved.String(), Status: status, Reason: reason, Message: message, ObservedGeneration: pool.Generation}
}

// setImageStatus records img in status: status.image and the
// ImageResolved condition.
func setImageStatus(status *kaironv1.MachinePoolStatus, img poolImageState) {
	status.Image = img.status
	if img.cond == nil {
		meta.RemoveStatusCondition(&status.Conditions, kaironv1.ConditionImageResolved.String())
		return
	}
	meta.SetStatusCondition(&status.Conditions, *img.cond)
}

func ptrTime(t metav1.Time) *metav1.Time { return &t }
