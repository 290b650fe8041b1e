package kaironctl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// How claim creates its MachineClaim. The API server turns a create away
// for a while in two cases that are no fault of the claim: 503 Service
// Unavailable, while it has not yet loaded the schema of a CRD installed
// seconds ago (Kairon's claim-finalizer admission policy needs it), and 429
// Too Many Requests, when it is overloaded or shutting down. Both come
// before the API server acts on the request, so the create is sent again,
// with a growing pause or the one the server asks for, until
// claimCreateRetryFor has passed. A script that installs the chart and
// claims at once (CI) gets its claim.
var claimCreateRetryFor = 30 * time.Second // a variable for tests

const (
	claimCreateFirstPause  = 100 * time.Millisecond
	claimCreateLongestWait = 2 * time.Second
)

// turnedAway says whether the API server refused a create without acting
// on it, and for how long it asks the client to wait (0: not said).
func turnedAway(err error) (bool, time.Duration) {
	if !apierrors.IsServiceUnavailable(err) && !apierrors.IsTooManyRequests(err) {
		return false, 0
	}
	after, _ := apierrors.SuggestsClientDelay(err)
	return true, time.Duration(after) * time.Second
}

// createClaim creates the claim the flags describe on pool in ns and
// returns it as the API server stored it.
func (o *Options) createClaim(ctx context.Context, c client.Client, ns, pool string, spec *kaironv1.MachineClaimSpec, f *claimFlags) (*kaironv1.MachineClaim, error) {
	claimKind, _ := lookupKind("machineclaims")
	stamped := true
	name := f.name
	if !f.nameGiven {
		name = generatedClaimName(pool)
	}
	var (
		firstTurnedAway time.Time
		pause           = claimCreateFirstPause
		drawn           = 0
	)
	for {
		// Stamped with the time to the millisecond, which the claim's
		// bindMillis is measured from (creationTimestamp has whole seconds).
		claim := &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: maps.Clone(f.claimLabels)},
			Spec:       *spec.DeepCopy(),
		}
		if stamped {
			claim.Annotations = map[string]string{kaironv1.AnnotationClaimCreatedAt: time.Now().UTC().Format(rules.ClaimStampFormat)}
		}
		err := c.Create(ctx, claim)
		if err == nil {
			return claim, nil
		}
		if again, wait := turnedAway(err); again {
			if firstTurnedAway.IsZero() {
				firstTurnedAway = time.Now()
			}
			if time.Since(firstTurnedAway)+max(wait, pause) > claimCreateRetryFor {
				return nil, fmt.Errorf("%w (still turned away after %s of trying)", claimCreateError(claimKind, ns, name, err),
					time.Since(firstTurnedAway).Round(100*time.Millisecond))
			}
			if err := sleepCtx(ctx, max(wait, pause)); err != nil {
				return nil, fmt.Errorf("%w (then: %w)", claimCreateError(claimKind, ns, name, err), err)
			}
			pause = min(2*pause, claimCreateLongestWait)
			continue
		}
		// The API server refuses a stamp its clock rules out: this
		// machine's clock is off, or the request waited in an overloaded
		// API server for more than a second. The claim is still wanted,
		// unstamped.
		if stamped && stampRefused(err) {
			fmt.Fprintf(o.ErrOut, "warning: the API server refused this machine's clock for %s: the clock is off, or the API server took over a second to create the claim (%v); creating the claim without it, so its bindMillis is measured from when the controller first saw it\n",
				kaironv1.AnnotationClaimCreatedAt, err)
			stamped = false
			continue
		}
		// A generated name that happens to be taken is drawn again.
		if apierrors.IsAlreadyExists(err) && !f.nameGiven && drawn < 5 {
			drawn++
			name = generatedClaimName(pool)
			continue
		}
		return nil, claimCreateError(claimKind, ns, name, err)
	}
}

// claimStampField is the field path of the creation stamp, as the API
// server's claim-creation-stamp policy names it in its refusals.
var claimStampField = field.NewPath("metadata", "annotations").Key(kaironv1.AnnotationClaimCreatedAt).String()

// stampRefused tells whether err is the API server refusing a claim's
// creation stamp: a 422 Invalid whose Status has a cause about the stamp's
// field. A schema or webhook refusal names the field in the cause's Field;
// a ValidatingAdmissionPolicy's cause carries only its message, which the
// claim-creation-stamp policy starts with the field path, as field errors do.
func stampRefused(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Field == claimStampField || strings.Contains(cause.Message, claimStampField+": ") {
			return true
		}
	}
	return false
}

// sleepCtx waits d, or until ctx ends (returning its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
