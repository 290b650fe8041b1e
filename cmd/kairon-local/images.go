package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/zyvor/kairon/internal/userimages"
)

// ensureImages makes sure the registry at address holds every image users
// start from (userimages.All): built once into cache (shared by every
// kairon-local of this user) and pushed when the registry lacks that build,
// so a second up neither builds nor pushes. Progress goes to log.
func ensureImages(ctx context.Context, address, cache string, log io.Writer) ([]userimages.Result, error) {
	o := userimages.Options{CacheDir: cache, Progress: &prefixWriter{prefix: "kairon-local: ", w: log}}
	var results []userimages.Result
	var errs []error
	for _, img := range userimages.All {
		res, err := img.Ensure(ctx, address, o)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", img.Name(), err))
			continue
		}
		results = append(results, res)
	}
	return results, errors.Join(errs...)
}

// imagesLine is the how-to's text about the registry: its address and
// what it holds, or why it holds less.
func imagesLine(address string, results []userimages.Result, failed error) string {
	if address == "" {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nRegistry (OCI, plain HTTP, on this machine only): %s\n", address)
	for _, r := range results {
		fmt.Fprintf(&b, "  %s@%s\n", r.Reference, r.Digest)
	}
	if failed != nil {
		fmt.Fprintf(&b, "  warning: %v\n", failed)
	}
	fmt.Fprintf(&b, "  push your own: podman push --tls-verify=false IMAGE %s/NAME:TAG (docs/guides/images.md)\n", address)
	return b.String()
}

// prefixWriter starts every line written to w with prefix.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	mid    bool // within a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out bytes.Buffer
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !p.mid {
			out.WriteString(p.prefix)
		}
		out.Write(line)
		p.mid = line[len(line)-1] != '\n'
	}
	if _, err := p.w.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil
}
