package node

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
)

// countingReviewer answers like nsReader and counts what it was asked.
type countingReviewer struct {
	tokens, access int
}

func (c *countingReviewer) reviewToken(ctx context.Context, token string) (consoleUser, bool, error) {
	c.tokens++
	return nsReader{}.reviewToken(ctx, token)
}

func (c *countingReviewer) mayAccess(ctx context.Context, user consoleUser, access machineAccess, namespace, name string) (bool, error) {
	c.access++
	return nsReader{}.mayAccess(ctx, user, access, namespace, name)
}

func (c *countingReviewer) mayImpersonate(ctx context.Context, user consoleUser, target impersonationTarget) (bool, error) {
	c.access++
	return nsReader{}.mayImpersonate(ctx, user, target)
}

// TestConsoleAuthCachesBriefly: a decision is reused within
// consoleDecisionTTL and asked again after it, for tokens and for access
// alike, denials included.
func TestConsoleAuthCachesBriefly(t *testing.T) {
	reviewer := &countingReviewer{}
	auth := newConsoleAuth(reviewer)
	now := time.Unix(1000, 0)
	auth.now = func() time.Time { return now }
	ask := func(token, namespace string) int {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		user, ok := auth.authenticate(w, r)
		if ok && auth.authorize(w, r, user, readConsole, namespace, "vm") {
			return http.StatusOK
		}
		return w.Code
	}
	for _, c := range []struct {
		token, namespace string
		advance          time.Duration
		code             int
		tokens, access   int
	}{
		{"reader", "ns", 0, http.StatusOK, 1, 1},
		{"reader", "ns", consoleDecisionTTL / 2, http.StatusOK, 1, 1},
		{"reader", "other", 0, http.StatusForbidden, 1, 2},
		{"reader", "other", 0, http.StatusForbidden, 1, 2},
		{"forged", "ns", 0, http.StatusUnauthorized, 2, 2},
		{"forged", "ns", 0, http.StatusUnauthorized, 2, 2},
		{"reader", "ns", consoleDecisionTTL, http.StatusOK, 3, 3},
	} {
		now = now.Add(c.advance)
		if code := ask(c.token, c.namespace); code != c.code || reviewer.tokens != c.tokens || reviewer.access != c.access {
			t.Errorf("%s in %s after +%v: %d with %d token and %d access reviews, want %d with %d and %d",
				c.token, c.namespace, c.advance, code, reviewer.tokens, reviewer.access, c.code, c.tokens, c.access)
		}
	}
}

// TestConsoleAuthCacheIsBounded: a flood of distinct tokens never grows
// the cache past consoleCacheSize.
func TestConsoleAuthCacheIsBounded(t *testing.T) {
	auth := newConsoleAuth(&countingReviewer{})
	for i := range 3 * consoleCacheSize {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("Authorization", fmt.Sprintf("Bearer forged-%d", i))
		auth.authenticate(httptest.NewRecorder(), r)
		if len(auth.tokens) > consoleCacheSize {
			t.Fatalf("after %d tokens the cache holds %d, more than %d", i+1, len(auth.tokens), consoleCacheSize)
		}
	}
}

// TestDecisionKeyTellsReviewsApart: reviews that differ in any part get
// different keys, however the parts are split.
func TestDecisionKeyTellsReviewsApart(t *testing.T) {
	base := consoleUser{name: "alice", groups: []string{"a", "b"}, extra: map[string]authzv1.ExtraValue{"k": {"v"}}}
	variants := map[string]struct {
		user          consoleUser
		namespace, vm string
	}{
		"base":              {base, "ns", "vm"},
		"other name":        {consoleUser{name: "alicens", groups: base.groups, extra: base.extra}, "", "vm"},
		"other namespace":   {base, "ns2", "vm"},
		"other machine":     {base, "ns", "vm2"},
		"fewer groups":      {consoleUser{name: "alice", groups: []string{"a"}, extra: base.extra}, "ns", "vm"},
		"merged groups":     {consoleUser{name: "alice", groups: []string{"a\x00b"}, extra: base.extra}, "ns", "vm"},
		"other extra":       {consoleUser{name: "alice", groups: base.groups, extra: map[string]authzv1.ExtraValue{"k": {"w"}}}, "ns", "vm"},
		"no extra":          {consoleUser{name: "alice", groups: base.groups}, "ns", "vm"},
		"uid":               {consoleUser{name: "alice", uid: "1", groups: base.groups, extra: base.extra}, "ns", "vm"},
		"name in namespace": {consoleUser{name: "", groups: base.groups, extra: base.extra}, "alicens", "vm"},
	}
	seen := map[string]string{}
	for what, v := range variants {
		key := decisionKey(v.user, readConsole, v.namespace, v.vm)
		if other, dup := seen[key]; dup {
			t.Errorf("%s and %s share a key", what, other)
		}
		seen[key] = what
	}
	for _, access := range []machineAccess{attachConsole, execMachine, {verb: "get", subresource: "exec"}} {
		if key := decisionKey(base, access, "ns", "vm"); seen[key] != "" {
			t.Errorf("%s shares a key with %s", access, seen[key])
		} else {
			seen[key] = access.String()
		}
	}
	reordered := consoleUser{name: "alice", groups: []string{"b", "a"}, extra: base.extra}
	if decisionKey(reordered, readConsole, "ns", "vm") != decisionKey(base, readConsole, "ns", "vm") {
		t.Error("the order of groups changed the key")
	}
}
