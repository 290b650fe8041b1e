package rules

import (
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// NewDisruptionRefusal is how the MachineMigration webhook refuses a
// migration that a disruption budget does not allow now: 429 Too Many
// Requests with a DisruptionBudget cause, as the Eviction API refuses an
// eviction a PodDisruptionBudget forbids. 429 says "not now, try later":
// the budget may allow it once a disrupted Machine is healthy again.
func NewDisruptionRefusal(m *kaironv1.Machine, why string) *apierrors.StatusError {
	message := fmt.Sprintf("moving machine %s/%s now would break its disruption budget: %s", m.Namespace, m.Name, why)
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusTooManyRequests,
		Reason:  metav1.StatusReasonTooManyRequests,
		Message: message,
		Details: &metav1.StatusDetails{
			Group:  kaironv1.GroupVersion.Group,
			Kind:   "Machine",
			Name:   m.Name,
			Causes: []metav1.StatusCause{{Type: kaironv1.CauseTypeDisruptionBudget, Message: why}},
		},
	}}
}

// IsDisruptionRefusal says whether err is a refusal by a disruption budget,
// as NewDisruptionRefusal makes it, however many layers (the API server's
// "admission webhook denied the request", a wrapping fmt.Errorf) lie around
// it. why is the budget's own account.
func IsDisruptionRefusal(err error) (why string, ok bool) {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return "", false
	}
	s := status.Status()
	if s.Code != http.StatusTooManyRequests || s.Details == nil {
		return "", false
	}
	for _, c := range s.Details.Causes {
		if c.Type == kaironv1.CauseTypeDisruptionBudget {
			return c.Message, true
		}
	}
	return "", false
}
