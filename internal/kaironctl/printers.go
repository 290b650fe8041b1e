package kaironctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Output formats for -o.
const (
	outputTable = "table"
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
	outputName  = "name"
	// outputJSONPath is -o jsonpath=TEMPLATE.
	outputJSONPath = "jsonpath"
)

var outputFormats = []string{outputTable, outputWide, outputJSON, outputYAML, outputName, outputJSONPath + "=TEMPLATE"}

// parseOutput checks the value of -o; empty means table. For
// jsonpath=TEMPLATE it also returns the parsed template, which, as in
// kubectl, lets a key that is not there print as nothing.
func parseOutput(s string) (string, *jsonpath.JSONPath, error) {
	if s == "" {
		return outputTable, nil, nil
	}
	if tmpl, found := strings.CutPrefix(s, outputJSONPath+"="); found || s == outputJSONPath {
		if !found || tmpl == "" {
			return "", nil, fmt.Errorf("-o/--output jsonpath needs a template, e.g. -o jsonpath='{.status.phase}'")
		}
		jp := jsonpath.New("output").AllowMissingKeys(true)
		if err := jp.Parse(tmpl); err != nil {
			return "", nil, fmt.Errorf("-o/--output jsonpath template %q: %v", tmpl, err)
		}
		return outputJSONPath, jp, nil
	}
	for _, f := range outputFormats {
		if s == f {
			return s, nil, nil
		}
	}
	return "", nil, fmt.Errorf("unknown output format %q for -o/--output; valid formats: %s", s, strings.Join(outputFormats, ", "))
}

// printJSONPath writes tmpl applied to v, with nothing after it (as
// kubectl, so that $(kaironctl get ... -o jsonpath=...) is the value).
func printJSONPath(w io.Writer, tmpl *jsonpath.JSONPath, v any) error {
	if err := tmpl.Execute(w, v); err != nil {
		return fmt.Errorf("-o jsonpath: %v", err)
	}
	return nil
}

// table is rows of cells under columns, ready to print.
type table struct {
	Columns []Column
	Rows    [][]string
}

// rowStream prints a table aligned like kubectl (upper-case headers,
// columns separated by at least two spaces, "-" for an empty cell, wide
// columns left out unless wide), also when it arrives a few rows at a time
// (get -w): the header once, before the first rows, and every column
// at least as wide as any of its cells printed so far, plus two spaces.
// Written in one piece, a table comes out as text/tabwriter would align it.
type rowStream struct {
	w    io.Writer
	wide bool
	// noHeaders leaves the header out (and out of the column widths).
	noHeaders bool
	widths    []int // of each kept column, without the two-space gap
	headed    bool
}

// write prints t's rows, after its header if none was printed yet.
func (s *rowStream) write(t table) error {
	var keep []int
	for i, c := range t.Columns {
		if s.wide || !c.Wide {
			keep = append(keep, i)
		}
	}
	if len(s.widths) != len(keep) {
		s.widths = make([]int, len(keep))
	}
	var lines [][]string
	cells := func(cell func(i int) string) []string {
		line := make([]string, len(keep))
		for j, i := range keep {
			line[j] = cell(i)
			if j < len(keep)-1 {
				line[j] += strings.Repeat(" ", t.Columns[i].Pad)
			}
			s.widths[j] = max(s.widths[j], utf8.RuneCountInString(line[j]))
		}
		return line
	}
	if !s.headed && !s.noHeaders {
		lines = append(lines, cells(func(i int) string { return strings.ToUpper(t.Columns[i].Header) }))
	}
	s.headed = true
	for _, row := range t.Rows {
		lines = append(lines, cells(func(i int) string {
			if i >= len(row) {
				return "-"
			}
			return cleanCell(row[i])
		}))
	}
	var b strings.Builder
	for _, line := range lines {
		for j, cell := range line {
			b.WriteString(cell)
			if j < len(line)-1 {
				b.WriteString(strings.Repeat(" ", s.widths[j]+2-utf8.RuneCountInString(cell)))
			}
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(s.w, b.String())
	return err
}

// cleanCell keeps a cell on one line and in its column.
func cleanCell(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// printJSON writes v as JSON indented by two spaces, ending in a newline.
func printJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// printYAML writes v as YAML.
func printYAML(w io.Writer, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// printNames writes "singular/name" per object, like kubectl -o name.
func printNames(w io.Writer, k *Kind, items []unstructured.Unstructured) error {
	var b strings.Builder
	for i := range items {
		b.WriteString(k.ref(items[i].GetName()))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// listObject wraps items the way kubectl prints several objects as JSON or
// YAML: a v1 List.
func listObject(items []unstructured.Unstructured) map[string]any {
	objs := make([]any, len(items))
	for i := range items {
		objs[i] = items[i].Object
	}
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "List",
		"metadata":   map[string]any{"resourceVersion": ""},
		"items":      objs,
	}
}

// printable is a typed object as -o json and -o yaml print one: its fields
// as the server sent them, with apiVersion and kind (gvk, when the object
// lacks them), without metadata.managedFields. A typed object renders an
// empty status as {}, where the server leaves it out; so does printable.
func printable(obj client.Object, gvk schema.GroupVersionKind) (map[string]any, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("printing %s %q: %w", gvk.Kind, obj.GetName(), err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetManagedFields(nil)
	if u.GetAPIVersion() == "" || u.GetKind() == "" {
		u.SetGroupVersionKind(gvk)
	}
	if status, ok := m["status"].(map[string]any); ok && len(status) == 0 {
		delete(m, "status")
	}
	return m, nil
}
