package controller

import (
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestCordonEvacuationStrategy(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    kaironv1.MigrationStrategy
		wantErr string
	}{
		{"", kaironv1.MigrationCold, ""},
		{"cold", kaironv1.MigrationCold, ""},
		// auto will mean live where possible; until node agents carry out
		// migrations it is cold.
		{"auto", kaironv1.MigrationCold, ""},
		{"live", "", `-cordon-evacuate-strategy "live" is not allowed: cordon evacuation never starts live migrations on its own`},
		{"Cold", "", `-cordon-evacuate-strategy "Cold" is not valid; use cold or auto`},
	} {
		got, err := CordonEvacuationStrategy(tt.in)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CordonEvacuationStrategy(%q) = %q, %v; want %q, %q", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
