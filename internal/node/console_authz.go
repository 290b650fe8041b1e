package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Console requests are authenticated and authorized the way a kubelet does
// it (issue 10, finding 3): a client certificate verified against
// --client-ca-file (user = Subject CN, groups = Subject O), or a bearer
// token the API server vouches for (TokenReview); then, per request, a
// SubjectAccessReview for get on machines/console in the Machine's
// namespace (create machines/console to attach, create machines/exec for
// exec and file copy: exec_server.go). A CA-signed certificate alone no
// longer opens every console:
// through the API server's node proxy the request carries the API server's
// kubelet-client identity, which RBAC must grant get machines/console.

// consoleUser is an authenticated requester, or the user it impersonates
// (console_impersonation.go).
type consoleUser struct {
	name   string
	uid    string
	groups []string
	extra  map[string]authzv1.ExtraValue
	// impersonatedBy is the name of the authenticated requester when this
	// is the user it impersonates, for the logs; authorization never
	// looks at it.
	impersonatedBy string
}

// accessReviewer asks the API server who a token is and what a user may do.
type accessReviewer interface {
	// reviewToken returns the user a bearer token authenticates, ok false
	// if it authenticates none.
	reviewToken(ctx context.Context, token string) (user consoleUser, ok bool, err error)
	// mayAccess tells whether user may do access (a verb on a subresource
	// of machines) to namespace/name.
	mayAccess(ctx context.Context, user consoleUser, access machineAccess, namespace, name string) (bool, error)
	// mayImpersonate tells whether user may impersonate target.
	mayImpersonate(ctx context.Context, user consoleUser, target impersonationTarget) (bool, error)
}

// machineAccess is what a request to the node agent asks of a Machine: a
// verb on one of its subresources, as a SubjectAccessReview asks it.
type machineAccess struct{ verb, subresource string }

// The accesses the node agent's endpoints need (docs/guides/exec.md):
// reading the console log is get machines/console; attaching to the
// console (typing into it) is create machines/console; exec and file copy
// are create machines/exec, as kubectl exec and cp need create pods/exec.
var (
	readConsole   = machineAccess{verb: "get", subresource: "console"}
	attachConsole = machineAccess{verb: "create", subresource: "console"}
	execMachine   = machineAccess{verb: "create", subresource: "exec"}
)

func (m machineAccess) String() string { return m.verb + " machines/" + m.subresource }

// apiReviewer is accessReviewer through TokenReview and SubjectAccessReview.
type apiReviewer struct{ c client.Client }

func (r apiReviewer) reviewToken(ctx context.Context, token string) (consoleUser, bool, error) {
	review := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}
	if err := r.c.Create(ctx, review); err != nil {
		return consoleUser{}, false, err
	}
	if !review.Status.Authenticated {
		return consoleUser{}, false, nil
	}
	u := review.Status.User
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	return consoleUser{name: u.Username, uid: u.UID, groups: u.Groups, extra: extra}, true, nil
}

func (r apiReviewer) mayAccess(ctx context.Context, user consoleUser, access machineAccess, namespace, name string) (bool, error) {
	review := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.name, UID: user.uid, Groups: user.groups, Extra: user.extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: namespace, Verb: access.verb, Group: kaironv1.GroupVersion.Group,
			Resource: "machines", Subresource: access.subresource, Name: name,
		},
	}}
	if err := r.c.Create(ctx, review); err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

func (r apiReviewer) mayImpersonate(ctx context.Context, user consoleUser, target impersonationTarget) (bool, error) {
	review := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.name, UID: user.uid, Groups: user.groups, Extra: user.extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: target.namespace, Verb: "impersonate", Group: target.group,
			Resource: target.resource, Subresource: target.subresource, Name: target.name,
		},
	}}
	if err := r.c.Create(ctx, review); err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

// consoleDecisionTTL is how long an authentication or authorization result
// is reused, as the kubelet caches its webhook decisions: a revoked
// permission or token still works for at most this long. Streams that
// follow a console are authorized once, when they start.
const consoleDecisionTTL = 10 * time.Second

// consoleCacheSize bounds the cache: a flood of distinct tokens or users
// costs API requests, never the agent's memory.
const consoleCacheSize = 4096

// consoleAuth authenticates and authorizes console requests, caching the
// API server's answers briefly.
type consoleAuth struct {
	reviewer accessReviewer
	now      func() time.Time

	mu     sync.Mutex
	tokens map[string]cachedUser
	access map[string]cachedDecision
}

type cachedUser struct {
	user  consoleUser
	ok    bool
	until time.Time
}

type cachedDecision struct {
	allowed bool
	until   time.Time
}

func newConsoleAuth(reviewer accessReviewer) *consoleAuth {
	return &consoleAuth{reviewer: reviewer, now: time.Now, tokens: map[string]cachedUser{}, access: map[string]cachedDecision{}}
}

// authenticate finds who r acts as: who sent it (identify), or the user
// its Impersonate-* headers name if the sender may impersonate it
// (console_impersonation.go). On failure it answers 401, 403 or 400 (500
// if the API server could not be asked) and returns ok false.
func (c *consoleAuth) authenticate(w http.ResponseWriter, r *http.Request) (consoleUser, bool) {
	requester, ok := c.identify(w, r)
	if !ok {
		return consoleUser{}, false
	}
	return c.impersonate(w, r, requester)
}

// identify finds who sent r: its verified client certificate, else its
// bearer token. On failure it answers 401 (500 if the API server could not
// be asked) and returns ok false.
func (c *consoleAuth) identify(w http.ResponseWriter, r *http.Request) (consoleUser, bool) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		leaf := r.TLS.VerifiedChains[0][0]
		groups := append(slices.Clone(leaf.Subject.Organization), "system:authenticated")
		return consoleUser{name: leaf.Subject.CommonName, groups: groups}, true
	}
	scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" || c == nil {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return consoleUser{}, false
	}
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	c.mu.Lock()
	cached, hit := c.tokens[key]
	c.mu.Unlock()
	if !hit || c.now().After(cached.until) {
		user, ok, err := c.reviewer.reviewToken(r.Context(), token)
		if err != nil {
			log.FromContext(r.Context()).Error(err, "console: TokenReview failed")
			http.Error(w, "Authentication unavailable", http.StatusInternalServerError)
			return consoleUser{}, false
		}
		cached = cachedUser{user: user, ok: ok, until: c.now().Add(consoleDecisionTTL)}
		c.mu.Lock()
		c.tokens = store(c.tokens, key, cached, c.now())
		c.mu.Unlock()
	}
	if !cached.ok {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return consoleUser{}, false
	}
	return cached.user, true
}

// authorize answers 403 unless user may do access to namespace/name (500
// if the API server could not be asked).
func (c *consoleAuth) authorize(w http.ResponseWriter, r *http.Request, user consoleUser, access machineAccess, namespace, name string) bool {
	if c == nil {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return false
	}
	allowed, err := c.decide(r.Context(), decisionKey(user, access, namespace, name), func() (bool, error) {
		return c.reviewer.mayAccess(r.Context(), user, access, namespace, name)
	})
	if err != nil {
		log.FromContext(r.Context()).Error(err, "SubjectAccessReview failed", "access", access.String())
		http.Error(w, "Authorization unavailable", http.StatusInternalServerError)
		return false
	}
	if !allowed {
		http.Error(w, "Forbidden", http.StatusForbidden)
		return false
	}
	return true
}

// decide is the cached answer to the SubjectAccessReview key stands for,
// asking ask when there is none or it expired.
func (c *consoleAuth) decide(ctx context.Context, key string, ask func() (bool, error)) (bool, error) {
	c.mu.Lock()
	cached, hit := c.access[key]
	c.mu.Unlock()
	if hit && !c.now().After(cached.until) {
		return cached.allowed, nil
	}
	allowed, err := ask()
	if err != nil {
		return false, err
	}
	cached = cachedDecision{allowed: allowed, until: c.now().Add(consoleDecisionTTL)}
	c.mu.Lock()
	c.access = store(c.access, key, cached, c.now())
	c.mu.Unlock()
	return allowed, nil
}

// decisionKey identifies one SubjectAccessReview. Every part is written
// with its length first, so no two different reviews share a key whatever
// bytes the names hold; groups and the extra's keys are sorted, their
// order means nothing.
func decisionKey(user consoleUser, access machineAccess, namespace, name string) string {
	return reviewKey(user, access.verb, kaironv1.GroupVersion.Group, "machines", access.subresource, namespace, name)
}

// impersonationKey identifies the SubjectAccessReview of user
// impersonating target.
func impersonationKey(user consoleUser, target impersonationTarget) string {
	return reviewKey(user, "impersonate", target.group, target.resource, target.subresource, target.namespace, target.name)
}

// reviewKey identifies the SubjectAccessReview of user doing verb on a
// resource (see decisionKey).
func reviewKey(user consoleUser, verb, group, resource, subresource, namespace, name string) string {
	h := sha256.New()
	put := func(s string) { fmt.Fprintf(h, "%d:%s", len(s), s) }
	put(verb)
	put(group)
	put(resource)
	put(subresource)
	put(user.name)
	put(user.uid)
	put(namespace)
	put(name)
	groups := slices.Clone(user.groups)
	slices.Sort(groups)
	fmt.Fprintf(h, "g%d", len(groups))
	for _, g := range groups {
		put(g)
	}
	keys := slices.Sorted(maps.Keys(user.extra))
	fmt.Fprintf(h, "e%d", len(keys))
	for _, k := range keys {
		put(k)
		fmt.Fprintf(h, "v%d", len(user.extra[k]))
		for _, v := range user.extra[k] {
			put(v)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

type expiring interface{ expiry() time.Time }

func (c cachedUser) expiry() time.Time     { return c.until }
func (c cachedDecision) expiry() time.Time { return c.until }

// store puts v in m, first dropping expired entries when m is full, and
// everything if that was not enough: the cache never outgrows
// consoleCacheSize.
func store[V expiring](m map[string]V, key string, v V, now time.Time) map[string]V {
	if len(m) >= consoleCacheSize {
		for k, old := range m {
			if now.After(old.expiry()) {
				delete(m, k)
			}
		}
		if len(m) >= consoleCacheSize {
			m = map[string]V{}
		}
	}
	m[key] = v
	return m
}
