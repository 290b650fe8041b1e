package kaironctl

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// How kaironctl tells the API server's refusals apart: by their status
// code, reason and causes, never by the words of their messages. The
// migration refusals and what is worth retrying are every verb's, in
// internal/ops (ops.IsMigrationRefusal, ops.Retriable).

// isProxyRefusal says whether err is the API server refusing to proxy a
// request to a Node: it answers 400 Bad Request when the Node's address is
// one it will not proxy to (loopback, link-local, or one that does not
// resolve). Call it after agentError, which turns the node agent's own
// answers into plain errors, so that a 400 left is the API server's.
func isProxyRefusal(err error) bool { return apierrors.IsBadRequest(err) }
