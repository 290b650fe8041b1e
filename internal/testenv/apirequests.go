package testenv

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
)

var (
	requestTotalLine = regexp.MustCompile(`^apiserver_request_total()\{([^}]*)\} (\S+)$`)
	labelPair        = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// APIMetrics is one reading of the API server's /metrics. Rendering them
// is a large allocation for the API server, so a benchmark that needs
// several figures reads them once and takes each from the same reading.
type APIMetrics []byte

// ReadAPIMetrics reads the API server's /metrics through c, which must be
// allowed that path.
func ReadAPIMetrics(ctx context.Context, c rest.Interface) (APIMetrics, error) {
	raw, err := c.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	return raw, nil
}

// EachAPIRequestCounter reads the API server's /metrics through c and
// calls fn with the labels and value of every apiserver_request_total
// series: what benchmarks count writes by.
func EachAPIRequestCounter(ctx context.Context, c rest.Interface, fn func(labels map[string]string, v float64)) error {
	m, err := ReadAPIMetrics(ctx, c)
	if err != nil {
		return err
	}
	return m.eachRequestCounter(fn)
}

func (m APIMetrics) eachRequestCounter(fn func(labels map[string]string, v float64)) error {
	return eachSeries(m, requestTotalLine, func(_ string, labels map[string]string, v float64) { fn(labels, v) })
}

// eachSeries calls fn with the suffix, labels and value of every line of
// the metrics text raw that line matches; line's three groups are the
// suffix of the metric's name, its labels and its value.
func eachSeries(raw []byte, line *regexp.Regexp, fn func(suffix string, labels map[string]string, v float64)) error {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[p[1]] = p[2]
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		fn(m[1], labels, v)
	}
	return sc.Err()
}

// requestKind is "VERB resource", with "/subresource" when there is one.
func requestKind(labels map[string]string) string {
	key := labels["verb"] + " " + labels["resource"]
	if labels["subresource"] != "" {
		key += "/" + labels["subresource"]
	}
	return key
}

// APIRequests is apiserver_request_total summed by "VERB resource" (with
// "/subresource", and " (code)" when the code is not 2xx), for the verbs
// keep accepts (nil: every verb).
func APIRequests(ctx context.Context, c rest.Interface, keep func(verb string) bool) (map[string]float64, error) {
	m, err := ReadAPIMetrics(ctx, c)
	if err != nil {
		return nil, err
	}
	return m.Requests(keep)
}

// Requests is what APIRequests returns, from this reading.
func (m APIMetrics) Requests(keep func(verb string) bool) (map[string]float64, error) {
	out := map[string]float64{}
	err := m.eachRequestCounter(func(labels map[string]string, v float64) {
		if keep != nil && !keep(labels["verb"]) {
			return
		}
		key := requestKind(labels)
		if code := labels["code"]; code != "" && !strings.HasPrefix(code, "2") {
			key += " (" + code + ")"
		}
		out[key] += v
	})
	return out, err
}

// IsWrite tells whether an apiserver_request_total verb changes state.
func IsWrite(verb string) bool {
	switch verb {
	case "POST", "CREATE", "PUT", "UPDATE", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
		return true
	}
	return false
}

// RequestsSince is how many requests APIRequests counted since before, in
// total, and per item for the top most frequent kinds.
func RequestsSince(before, after map[string]float64, items, top int) (float64, string) {
	type kind struct {
		key string
		n   float64
	}
	var kinds []kind
	total := 0.0
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			kinds = append(kinds, kind{k, d})
			total += d
		}
	}
	slices.SortFunc(kinds, func(a, b kind) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var parts []string
	for _, k := range kinds[:min(top, len(kinds))] {
		parts = append(parts, fmt.Sprintf("%s %.2f", k.key, k.n/float64(items)))
	}
	return total, strings.Join(parts, ", ")
}

var requestDurationLine = regexp.MustCompile(`^apiserver_request_duration_seconds_(bucket|sum|count)\{([^}]*)\} (\S+)$`)

// RequestLatency is what the API server's apiserver_request_duration_seconds
// says of one kind of request: how many, their total time in seconds, and
// how many took longer than 50 ms.
type RequestLatency struct {
	Count, Sum, Over50ms float64
}

// Latencies is apiserver_request_duration_seconds by "VERB resource"
// (with "/subresource"), for the verbs keep accepts (nil: every verb). The
// API server measures from the request's arrival to its response, so this
// is its own time, without the client's or the network's.
func (m APIMetrics) Latencies(keep func(verb string) bool) (map[string]RequestLatency, error) {
	out := map[string]RequestLatency{}
	under50 := map[string]float64{}
	err := eachSeries(m, requestDurationLine, func(suffix string, labels map[string]string, v float64) {
		if keep != nil && !keep(labels["verb"]) {
			return
		}
		key := requestKind(labels)
		l := out[key]
		switch suffix {
		case "sum":
			l.Sum += v
		case "count":
			l.Count += v
		case "bucket":
			if labels["le"] == "0.05" {
				under50[key] += v
			}
		}
		out[key] = l
	})
	for key, l := range out {
		l.Over50ms = l.Count - under50[key]
		out[key] = l
	}
	return out, err
}

// LatenciesSince is, for each kind of request with over minCount requests
// since before, its count, its mean server time and how many took over
// 50 ms, most frequent first.
func LatenciesSince(before, after map[string]RequestLatency, minCount float64) string {
	type kind struct {
		key string
		d   RequestLatency
	}
	var kinds []kind
	for k, a := range after {
		b := before[k]
		d := RequestLatency{Count: a.Count - b.Count, Sum: a.Sum - b.Sum, Over50ms: a.Over50ms - b.Over50ms}
		if d.Count > minCount {
			kinds = append(kinds, kind{k, d})
		}
	}
	slices.SortFunc(kinds, func(a, b kind) int {
		if c := cmp.Compare(b.d.Count, a.d.Count); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s: %.0f, mean %.1f ms, over 50 ms %.0f", k.key, k.d.Count, 1000*k.d.Sum/k.d.Count, k.d.Over50ms))
	}
	return strings.Join(parts, "; ")
}
