package ops

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/zyvor/kairon/internal/rules"
)

// How the verbs tell the API server's answers apart: by their status code,
// reason and causes, never by the words of their messages.

// IsMigrationRefusal says whether err is the MachineMigration webhook
// refusing a create because the cluster moved on since the caller looked:
// a disruption budget spent meanwhile (429 with a DisruptionBudget cause,
// rules.IsDisruptionRefusal), or the Machine deleted meanwhile (422
// Invalid on spec.machineName). Both mean "not now" for that one Machine,
// not a failure: an evacuation skips it and goes on. Any other error (403
// first of all) is the caller's to end on.
func IsMigrationRefusal(err error) bool {
	if _, ok := rules.IsDisruptionRefusal(err); ok {
		return true
	}
	return apierrors.IsInvalid(err) && hasCauseOnField(err, "spec.machineName")
}

// hasCauseOnField says whether err is an API status error with a cause on
// field.
func hasCauseOnField(err error, field string) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}

// Retriable is an error that trying again may get past: a network error,
// a server error, throttling, a conflict. Refusals that will be the same
// next time (forbidden, unauthorized, a bad or invalid request, a resource
// or kind the server does not serve, a method it does not allow, an object
// that is not there) are not.
func Retriable(err error) bool {
	if meta.IsNoMatchError(err) || runtime.IsNotRegisteredError(err) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // a network error
	}
	return !apierrors.IsForbidden(err) && !apierrors.IsUnauthorized(err) && !apierrors.IsBadRequest(err) &&
		!apierrors.IsInvalid(err) && !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err)
}
