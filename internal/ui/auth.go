package ui

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// How kairon-ui knows who is asking (docs/guides/ui.md, "Auth").
//
// AuthToken (in a cluster): every request carries the user's own bearer
// token, in an Authorization header set by an authenticating proxy or in
// the HttpOnly, SameSite=Strict cookie the login page sets. Everything the
// user does goes to the API server with that token (a rest.Config with
// BearerToken, never impersonation), and the informer cache, which
// kairon-ui's own read-only ServiceAccount fills, answers a read only after
// a SelfSubjectAccessReview made with the user's token says the user may
// list that kind in that namespace (or in every namespace, when the request
// names none). The user's rights, not the ServiceAccount's, decide.
//
// AuthKubeconfig (kairon-local, a developer's laptop): every request is the
// kubeconfig's identity, which filled the cache; kairon-ui then listens on
// loopback only unless told otherwise.

// AuthMode is how requests are authenticated.
type AuthMode string

const (
	// AuthKubeconfig: every request acts as the identity kairon-ui runs
	// with.
	AuthKubeconfig AuthMode = "kubeconfig"
	// AuthToken: every request acts as the user whose bearer token it
	// carries.
	AuthToken AuthMode = "token"
)

// tokenCookie holds a token pasted at the login page.
const tokenCookie = "kairon_ui_token"

// csrfHeader must be on every action request: a cross-site form cannot set
// it, and a cross-site fetch that sets it needs a CORS preflight kairon-ui
// never answers.
const csrfHeader = "X-Kairon-UI"

// authTTL is how long a SelfSubjectAccessReview's or SelfSubjectReview's
// answer is reused for the same token.
const authTTL = 10 * time.Second

// user is who a request acts as.
type user struct {
	// cfg talks to the API server as the user.
	cfg *rest.Config
	// key identifies the user's credentials in the review cache (a hash
	// of the token; "" for the kubeconfig identity).
	key string
	// name is the user name the API server knows the credentials by ("" if
	// it was not asked).
	name string
	// trusted: the kubeconfig identity, which filled the cache itself, so
	// its reads need no review.
	trusted bool
}

type userKey struct{}

func userOf(ctx context.Context) *user {
	u, _ := ctx.Value(userKey{}).(*user)
	return u
}

// tokenOf is the request's bearer token: the Authorization header's, else
// the login cookie's.
func tokenOf(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
		return ""
	}
	if c, err := r.Cookie(tokenCookie); err == nil {
		return c.Value
	}
	return ""
}

// userConfig is s.cfg (server address and CA) with the token as the only
// credential.
func (s *Server) userConfig(token string) *rest.Config {
	cfg := rest.AnonymousClientConfig(s.cfg)
	cfg.BearerToken = token
	cfg.QPS, cfg.Burst = 50, 100
	return cfg
}

// userClient is a client acting as u, sharing the server's scheme and
// REST mapper.
func (s *Server) userClient(u *user) (client.Client, error) {
	return client.New(u.cfg, client.Options{Scheme: s.scheme, Mapper: s.mapper})
}

// reviews caches review answers by credentials and question.
type reviews struct {
	mu sync.Mutex
	m  map[string]reviewAnswer
}

type reviewAnswer struct {
	allowed bool
	reason  string
	name    string
	err     error
	expires time.Time
}

func (c *reviews) get(key string) (reviewAnswer, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.m[key]
	if !ok || time.Now().After(a.expires) {
		return reviewAnswer{}, false
	}
	return a, true
}

func (c *reviews) put(key string, a reviewAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if len(c.m) > 10000 {
		for k, v := range c.m {
			if now.After(v.expires) {
				delete(c.m, k)
			}
		}
	}
	a.expires = now.Add(authTTL)
	c.m[key] = a
}

// whoami asks the API server who the token is (a SelfSubjectReview); an
// invalid or expired token is the API server's 401.
func (s *Server) whoami(ctx context.Context, u *user) (string, error) {
	key := u.key + "\x00whoami"
	if a, ok := s.reviews.get(key); ok {
		return a.name, a.err
	}
	c, err := s.userClient(u)
	if err != nil {
		return "", err
	}
	review := &authenticationv1.SelfSubjectReview{}
	err = c.Create(ctx, review)
	switch {
	case err == nil, apierrors.IsUnauthorized(err):
	case apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		// Authenticated, but not allowed to ask (a trimmed
		// system:basic-user) or an API server without the API: the
		// token is good, its name unknown.
		err = nil
	default:
		return "", err // not cached: the API server may be back soon
	}
	s.reviews.put(key, reviewAnswer{name: review.Status.UserInfo.Username, err: err})
	return review.Status.UserInfo.Username, err
}

// access is one right a request may need.
type access struct {
	verb, group, resource, subresource string
	// cluster: the resource belongs to no namespace.
	cluster bool
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	return a.verb + " " + r
}

var (
	kaironGroup        = kaironv1.GroupVersion.Group
	listMachines       = access{verb: "list", group: kaironGroup, resource: "machines"}
	getMachines        = access{verb: "get", group: kaironGroup, resource: "machines"}
	listPools          = access{verb: "list", group: kaironGroup, resource: "machinepools"}
	listClaims         = access{verb: "list", group: kaironGroup, resource: "machineclaims"}
	listMigrations     = access{verb: "list", group: kaironGroup, resource: "machinemigrations"}
	listPolicies       = access{verb: "list", group: kaironGroup, resource: "machinenetworkpolicies"}
	listBudgets        = access{verb: "list", group: kaironGroup, resource: "machinedisruptionbudgets"}
	listNodes          = access{verb: "list", resource: "nodes", cluster: true}
	listEvents         = access{verb: "list", group: "events.k8s.io", resource: "events"}
	createMigrations   = access{verb: "create", group: kaironGroup, resource: "machinemigrations"}
	patchPoolScale     = access{verb: "patch", group: kaironGroup, resource: "machinepools", subresource: "scale"}
	errNotAuthenticate = errors.New("not signed in")
)

// can asks the API server, as u, whether u may do a in namespace ns (""
// is every namespace); the answer is reused for authTTL. The reason is
// the authorizer's, or ours when it gives none.
func (s *Server) can(ctx context.Context, u *user, a access, ns string) (bool, string, error) {
	if a.cluster {
		ns = ""
	}
	key := u.key + "\x00" + a.String() + "\x00" + ns
	if ans, ok := s.reviews.get(key); ok {
		return ans.allowed, ans.reason, ans.err
	}
	c, err := s.userClient(u)
	if err != nil {
		return false, "", err
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
		},
	}}
	if err := c.Create(ctx, review); err != nil {
		if apierrors.IsUnauthorized(err) {
			s.reviews.put(key, reviewAnswer{err: err})
		}
		return false, "", err
	}
	where := "in every namespace"
	if ns != "" {
		where = "in namespace " + ns
	} else if a.cluster {
		where = "(cluster-wide)"
	}
	reason := fmt.Sprintf("you may not %s %s", a, where)
	if review.Status.Reason != "" {
		reason += ": " + review.Status.Reason
	}
	ans := reviewAnswer{allowed: review.Status.Allowed && !review.Status.Denied, reason: reason}
	s.reviews.put(key, ans)
	return ans.allowed, ans.reason, nil
}

// forbidden is a read the user may not make.
type forbidden struct{ reason string }

func (f forbidden) Error() string { return f.reason }

// mayRead checks that the request's user may make every read of needs in
// namespace ns; the kubeconfig identity always may.
func (s *Server) mayRead(ctx context.Context, ns string, needs ...access) error {
	u := userOf(ctx)
	if u == nil {
		return errNotAuthenticate
	}
	if u.trusted {
		return nil
	}
	for _, a := range needs {
		ok, reason, err := s.can(ctx, u, a, ns)
		if err != nil {
			return err
		}
		if !ok {
			return forbidden{reason}
		}
	}
	return nil
}

// mayDo says whether the request's user may do a in ns, for showing an
// action's button; errors count as no.
func (s *Server) mayDo(ctx context.Context, a access, ns string) bool {
	u := userOf(ctx)
	if u == nil || !s.opts.AllowWrite {
		return false
	}
	ok, _, err := s.can(ctx, u, a, ns)
	return err == nil && ok
}

// authenticate puts the request's user in its context. With AuthToken, a
// request without a valid token gets 401 (the API) or goes to the login
// page (pages).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opts.Auth != AuthToken {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, s.self)))
			return
		}
		token := tokenOf(r)
		why := "sign in with a bearer token"
		if token != "" {
			sum := sha256.Sum256([]byte(token))
			u := &user{cfg: s.userConfig(token), key: hex.EncodeToString(sum[:])}
			name, err := s.whoami(r.Context(), u)
			switch {
			case err == nil:
				u.name = name
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
				return
			case apierrors.IsUnauthorized(err):
				why = "the API server did not accept the token: " + err.Error()
			default:
				writeError(w, http.StatusBadGateway, "asking the API server who the token is: "+err.Error())
				return
			}
		}
		if strings.HasPrefix(r.URL.Path, "/api/") {
			writeError(w, http.StatusUnauthorized, why)
			return
		}
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	})
}

// checkSameOrigin refuses a state-changing request that may come from
// another site: it must carry the X-Kairon-UI header (which a cross-site
// form cannot send, and a cross-site fetch cannot without a preflight), and
// an Origin or Sec-Fetch-Site the browser adds must be this site's.
func checkSameOrigin(r *http.Request, needHeader bool) error {
	if needHeader && r.Header.Get(csrfHeader) == "" {
		return fmt.Errorf("missing the %s header: actions are made from kairon-ui's pages (or send %s: 1)", csrfHeader, csrfHeader)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("cross-origin request from %s refused", o)
		}
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("request from a %s page refused", site)
	}
	return nil
}

// login is the login page (GET) and sets the token cookie (POST) once the
// API server accepts the token.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := r.FormValue("next")
	// Only a path of this site: not "//host" nor "/\host", which browsers
	// take for another site.
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		next = "/"
	}
	data := loginData{Next: next, Mode: string(s.opts.Auth)}
	if r.Method == http.MethodPost {
		if err := checkSameOrigin(r, false); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		token := strings.TrimSpace(r.PostFormValue("token"))
		if token == "" {
			data.Error = "Paste a bearer token."
			s.renderLogin(w, http.StatusUnauthorized, data)
			return
		}
		sum := sha256.Sum256([]byte(token))
		_, err := s.whoami(r.Context(), &user{cfg: s.userConfig(token), key: hex.EncodeToString(sum[:])})
		if err == nil {
			http.SetCookie(w, &http.Cookie{
				Name: tokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
				Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https",
			})
			http.Redirect(w, r, next, http.StatusSeeOther)
			return
		}
		data.Error = "The API server did not accept this token: " + err.Error()
		if !apierrors.IsUnauthorized(err) {
			data.Error = "Could not ask the API server who this token is: " + err.Error()
		}
		s.renderLogin(w, http.StatusUnauthorized, data)
		return
	}
	s.renderLogin(w, http.StatusOK, data)
}

// logout drops the token cookie.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if err := checkSameOrigin(r, false); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

type loginData struct {
	Next, Mode, Error string
}
