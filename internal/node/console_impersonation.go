package node

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// A request to the node agent may act as someone else the way a request to
// the API server does (issue 42): `kaironctl --as tenant-a exec` sends the
// standard Impersonate-User, Impersonate-Group, Impersonate-Uid and
// Impersonate-Extra-* headers to an agent it reaches directly, and the
// agent used to ignore them, authorizing and logging the session as the
// real credential. Now the agent, having authenticated the requester,
// checks with a SubjectAccessReview per header value that the requester
// may impersonate it, exactly as the API server's impersonation filter
// asks (verb impersonate on users, serviceaccounts or groups of the core
// group, on uids and userextras/KEY of authentication.k8s.io), and then
// authorizes and logs the request as the impersonated user. Through the
// API server's node proxy the API server does all this itself and drops
// the headers before proxying.

// impersonationTarget is one thing a request asks to act as, as the
// impersonate SubjectAccessReview names it.
type impersonationTarget struct {
	group, resource, subresource, namespace, name string
}

func (t impersonationTarget) String() string {
	resource := t.resource
	if t.subresource != "" {
		resource += "/" + t.subresource
	}
	name := t.name
	if t.namespace != "" {
		name = t.namespace + "/" + name
	}
	return fmt.Sprintf("%s %q", resource, name)
}

// impersonationRequest is what a request's Impersonate-* headers ask for:
// the user it becomes, and the targets the requester must be allowed to
// impersonate for that.
type impersonationRequest struct {
	user    consoleUser
	targets []impersonationTarget
}

// serviceAccountPrefix starts every ServiceAccount's user name.
const serviceAccountPrefix = "system:serviceaccount:"

// splitServiceAccount is namespace and name of a ServiceAccount's user
// name, ok false for any other name (as the API server tells them apart).
func splitServiceAccount(username string) (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(username, serviceAccountPrefix)
	if !found {
		return "", "", false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 2 || len(apivalidation.ValidateNamespaceName(parts[0], false)) != 0 ||
		len(apivalidation.ValidateServiceAccountName(parts[1], false)) != 0 {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// parseImpersonation reads r's Impersonate-* headers: nil if there are
// none, an error (a 400) if they ask for groups, a uid or extras without a
// user, as the API server refuses them.
func parseImpersonation(h http.Header) (*impersonationRequest, error) {
	username := h.Get(authnv1.ImpersonateUserHeader)
	groups := h.Values(authnv1.ImpersonateGroupHeader)
	uid := h.Get(authnv1.ImpersonateUIDHeader)
	extraKeys := []string{}
	for key := range h {
		if strings.HasPrefix(key, authnv1.ImpersonateUserExtraHeaderPrefix) {
			extraKeys = append(extraKeys, key)
		}
	}
	slices.Sort(extraKeys)
	if username == "" {
		var asked []string
		if len(groups) > 0 {
			asked = append(asked, authnv1.ImpersonateGroupHeader)
		}
		if uid != "" {
			asked = append(asked, authnv1.ImpersonateUIDHeader)
		}
		if len(extraKeys) > 0 {
			asked = append(asked, authnv1.ImpersonateUserExtraHeaderPrefix+"*")
		}
		if len(asked) > 0 {
			return nil, fmt.Errorf("%s without %s: impersonating groups, a uid or extras needs a user", strings.Join(asked, ", "), authnv1.ImpersonateUserHeader)
		}
		return nil, nil
	}
	req := &impersonationRequest{user: consoleUser{name: username, uid: uid}}
	if ns, name, ok := splitServiceAccount(username); ok {
		req.targets = append(req.targets, impersonationTarget{resource: "serviceaccounts", namespace: ns, name: name})
		if len(groups) == 0 {
			// A ServiceAccount's groups follow from its name.
			req.user.groups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}
		}
	} else {
		req.targets = append(req.targets, impersonationTarget{resource: "users", name: username})
	}
	for _, g := range groups {
		req.targets = append(req.targets, impersonationTarget{resource: "groups", name: g})
		req.user.groups = append(req.user.groups, g)
	}
	for _, header := range extraKeys {
		key := strings.ToLower(strings.TrimPrefix(header, authnv1.ImpersonateUserExtraHeaderPrefix))
		if unescaped, err := url.PathUnescape(key); err == nil {
			key = unescaped
		}
		for _, v := range h.Values(header) {
			req.targets = append(req.targets, impersonationTarget{group: authnv1.GroupName, resource: "userextras", subresource: key, name: v})
			if req.user.extra == nil {
				req.user.extra = map[string]authzv1.ExtraValue{}
			}
			req.user.extra[key] = append(req.user.extra[key], v)
		}
	}
	if uid != "" {
		req.targets = append(req.targets, impersonationTarget{group: authnv1.GroupName, resource: "uids", name: uid})
	}
	// Everyone but the anonymous user is in system:authenticated, unless
	// the groups asked for say otherwise (the API server's rule).
	if username == "system:anonymous" {
		if !slices.Contains(req.user.groups, "system:unauthenticated") {
			req.user.groups = append(req.user.groups, "system:unauthenticated")
		}
	} else if !slices.Contains(req.user.groups, "system:authenticated") && !slices.Contains(req.user.groups, "system:unauthenticated") {
		req.user.groups = append(req.user.groups, "system:authenticated")
	}
	return req, nil
}

// impersonate returns the user r acts as: requester itself without
// Impersonate-* headers, else the impersonated user, once requester was
// found allowed to impersonate every target. A request that may not is
// answered 403 naming the first target refused (400 for headers that make
// no sense, 500 if the API server could not be asked).
func (c *consoleAuth) impersonate(w http.ResponseWriter, r *http.Request, requester consoleUser) (consoleUser, bool) {
	req, err := parseImpersonation(r.Header)
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return consoleUser{}, false
	case req == nil:
		return requester, true
	}
	for _, target := range req.targets {
		key := impersonationKey(requester, target)
		allowed, err := c.decide(r.Context(), key, func() (bool, error) {
			return c.reviewer.mayImpersonate(r.Context(), requester, target)
		})
		if err != nil {
			log.FromContext(r.Context()).Error(err, "SubjectAccessReview failed", "impersonate", target.String())
			http.Error(w, "Authorization unavailable", http.StatusInternalServerError)
			return consoleUser{}, false
		}
		if !allowed {
			log.FromContext(r.Context()).WithName("guest-session").Info("refused",
				append(requester.logValues(), "impersonate", target.String(), "path", r.URL.Path)...)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not impersonate %s", requester.name, target), http.StatusForbidden)
			return consoleUser{}, false
		}
	}
	user := req.user
	user.impersonatedBy = requester.name
	return user, true
}

// logValues name u in a log line: user and groups, and "impersonatedBy"
// the requester who acts as u, if one does.
func (u consoleUser) logValues() []any {
	kv := []any{"user", u.name, "groups", u.groups}
	if u.impersonatedBy != "" {
		kv = append(kv, "impersonatedBy", u.impersonatedBy)
	}
	return kv
}
