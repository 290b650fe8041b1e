package kaironctl

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/zyvor/kairon/internal/rules"
)

// How kaironctl tells the API server's refusals apart: by their status
// code, reason and causes, never by the words of their messages.

// isMigrationRefusal says whether err is the MachineMigration webhook
// refusing a create because the cluster moved on since kaironctl looked:
// a disruption budget spent meanwhile (429 with a DisruptionBudget cause,
// rules.IsDisruptionRefusal), or the Machine deleted meanwhile (422
// Invalid on spec.machineName). Both mean "not now", not a failure.
func isMigrationRefusal(err error) bool {
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

// isProxyRefusal says whether err is the API server refusing to proxy a
// request to a Node: it answers 400 Bad Request when the Node's address is
// one it will not proxy to (loopback, link-local, or one that does not
// resolve). Call it after agentError, which turns the node agent's own
// answers into plain errors, so that a 400 left is the API server's.
func isProxyRefusal(err error) bool { return apierrors.IsBadRequest(err) }
