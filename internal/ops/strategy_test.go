package ops

import (
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestParseStrategy(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want kaironv1.MigrationStrategy
		ok   bool
	}{
		{in: "cold", want: kaironv1.MigrationCold, ok: true},
		{in: "live", want: kaironv1.MigrationLive, ok: true},
		// A default is the caller's: kaironctl's flag has one, kairon-ui
		// fills in cold.
		{in: ""},
		{in: "auto"},
		{in: "Live"},
	} {
		if got, ok := ParseStrategy(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("ParseStrategy(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
