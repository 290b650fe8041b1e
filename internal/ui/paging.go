package ui

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Paging. Every list is sorted by namespace and name, and a page is the
// items after a position in that order: ?limit=N items, and ?continue=TOKEN
// (the previous page's "continue") says where the page starts. A position
// is a key, not an index, so an object created or deleted between two
// pages shifts no other object: every object that exists from the first
// page to the last is on exactly one page.

const (
	// DefaultPageSize is the page size of the API and the Machines page
	// without ?limit=: 500 Machines are about 150 KB of JSON (30 KB
	// gzipped).
	DefaultPageSize = 500
	// MaxPageSize is the largest ?limit= the API takes.
	MaxPageSize = 5000
)

// keyed is an item of a paged list: key is its place in the order,
// namespace and name joined by a NUL (which sorts before every character
// a namespace may have, so the order of keys is that of (namespace, name)).
type keyed interface{ key() string }

func nsKey(ns, name string) string { return ns + "\x00" + name }

func (m Machine) key() string       { return nsKey(m.Namespace, m.Name) }
func (n Node) key() string          { return nsKey("", n.Name) }
func (p Pool) key() string          { return nsKey(p.Namespace, p.Name) }
func (c Claim) key() string         { return nsKey(c.Namespace, c.Name) }
func (m Migration) key() string     { return nsKey(m.Namespace, m.Name) }
func (p NetworkPolicy) key() string { return nsKey(p.Namespace, p.Name) }
func (b Budget) key() string        { return nsKey(b.Namespace, b.Name) }

// pageRequest is a request's ?limit= and ?continue=.
type pageRequest struct {
	limit int
	// after is the key of the last item of the previous page; "" starts
	// at the first item.
	after string
	// scope is what the continue token is bound to: the path and the
	// filters of the request.
	scope string
}

// pageRequestOf reads ?limit= and ?continue=. A continue token is refused
// unless it was made for this path and these filters and is intact.
func pageRequestOf(r *http.Request, def int) (pageRequest, error) {
	q := r.URL.Query()
	p := pageRequest{limit: def, scope: pageScope(r.URL.Path, q)}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return p, fmt.Errorf("invalid limit %q: a whole number from 1 to %d", v, MaxPageSize)
		}
		p.limit = n
	}
	if tok := q.Get("continue"); tok != "" {
		after, err := parseContinue(tok, p.scope)
		if err != nil {
			return p, err
		}
		p.after = after
	}
	return p, nil
}

// pageScope is the path and every query parameter but limit and continue,
// sorted: a page size may change from page to page, the filters may not.
// An empty parameter (a filter form's "any") is no filter, as if absent.
func pageScope(path string, q url.Values) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		if k != "limit" && k != "continue" && q.Get(k) != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(path)
	for _, k := range keys {
		b.WriteString("\x00" + k + "=" + q.Get(k))
	}
	return b.String()
}

// The continue token is "v1." and the base64url of the key, "." and a
// digest of the key and the scope. It is not secret (it names the last
// object of a page, which the client has seen), but it cannot be edited
// or moved to another query without being refused.
func makeContinue(after, scope string) string {
	return "v1." + base64.RawURLEncoding.EncodeToString([]byte(after)) + "." + continueDigest(after, scope)
}

func continueDigest(after, scope string) string {
	sum := sha256.Sum256([]byte("kairon-ui continue v1\x00" + scope + "\x00\x00" + after))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

func parseContinue(tok, scope string) (string, error) {
	bad := fmt.Errorf("invalid continue token %q: use the continue of the previous page of the same request (same path and filters)", tok)
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != "v1" {
		return "", bad
	}
	after, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || len(after) == 0 {
		return "", bad
	}
	if continueDigest(string(after), scope) != parts[2] {
		return "", bad
	}
	return string(after), nil
}

// pageOf is one page of sorted items, the continue token of the next page
// ("" on the last), and how many items come before the page.
func pageOf[T keyed](items []T, p pageRequest) (page []T, next string, before int) {
	start := 0
	if p.after != "" {
		start, _ = slices.BinarySearchFunc(items, p.after, func(it T, after string) int {
			return strings.Compare(it.key(), after)
		})
		// The item of key after (still there or not) was on the
		// previous page.
		if start < len(items) && items[start].key() == p.after {
			start++
		}
	}
	end := min(start+p.limit, len(items))
	if end < len(items) {
		next = makeContinue(items[end-1].key(), p.scope)
	}
	return items[start:end], next, start
}

// nextPageURL is the request's URL with continue set to next: the same
// filters and page size.
func nextPageURL(r *http.Request, next string) string {
	q := r.URL.Query()
	q.Set("continue", next)
	return r.URL.Path + "?" + q.Encode()
}

// firstPageURL is the request's URL without continue.
func firstPageURL(r *http.Request) string {
	q := r.URL.Query()
	q.Del("continue")
	if len(q) == 0 {
		return r.URL.Path
	}
	return r.URL.Path + "?" + q.Encode()
}
