package kaironctl

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseObjectArgs(t *testing.T) {
	type group struct {
		resource string
		names    []string
	}
	for _, tc := range []struct {
		args    []string
		want    []group
		wantErr string
	}{
		{args: []string{"machines"}, want: []group{{"machines", nil}}},
		{args: []string{"mc"}, want: []group{{"machineclaims", nil}}},
		{args: []string{"claims"}, want: []group{{"machineclaims", nil}}},
		{args: []string{"pool"}, want: []group{{"machinepools", nil}}},
		{args: []string{"machine", "a", "b"}, want: []group{{"machines", []string{"a", "b"}}}},
		{args: []string{"mc,mp,machines"}, want: []group{{"machineclaims", nil}, {"machinepools", nil}, {"machines", nil}}},
		// A kind given twice, under two of its names, is listed once.
		{args: []string{"mc,machineclaims"}, want: []group{{"machineclaims", nil}}},
		{args: []string{"machineclaim/job-42"}, want: []group{{"machineclaims", []string{"job-42"}}}},
		// Grouped by kind, in the order each kind first appears.
		{args: []string{"mc/a", "machine/m", "claim/b"}, want: []group{{"machineclaims", []string{"a", "b"}}, {"machines", []string{"m"}}}},
		{args: []string{"machinepools.kairon.zyvor.dev/p"}, want: []group{{"machinepools", []string{"p"}}}},

		{args: []string{"pods"}, wantErr: `unknown kind "pods"`},
		{args: []string{"mc,pods"}, wantErr: `unknown kind "pods"`},
		{args: []string{"pods/x"}, wantErr: `unknown kind "pods"`},
		{args: []string{"mc,,mp"}, wantErr: `"mc,,mp" has an empty KIND`},
		{args: []string{"mc,"}, wantErr: "empty KIND"},
		{args: []string{"mc,mp", "x"}, wantErr: "NAMEs cannot follow a list of kinds"},
		{args: []string{"mc", "mc/x"}, wantErr: `"mc/x" after the KIND "mc"`},
		{args: []string{"mc/x", "y"}, wantErr: `"y" is a bare NAME after "mc/x"`},
		{args: []string{"mc/"}, wantErr: `"mc/" is not KIND/NAME`},
		{args: []string{"/x"}, wantErr: `"/x" is not KIND/NAME`},
		{args: []string{"mc/x/y"}, wantErr: `"mc/x/y" is not KIND/NAME`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			groups, err := parseObjectArgs(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []group
			for _, g := range groups {
				got = append(got, group{g.kind.Resource, g.names})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestOneKindNamed(t *testing.T) {
	k, names, err := oneKindNamed("describe", []string{"mp/a"})
	if err != nil || k.Resource != "machinepools" || !reflect.DeepEqual(names, []string{"a"}) {
		t.Errorf("mp/a: %v %v %v", k, names, err)
	}
	_, _, err = oneKindNamed("describe", []string{"mp/a", "mc/b"})
	if err == nil || err.Error() != "describe works on one kind at a time, got machinepools, machineclaims" {
		t.Errorf("two kinds: %v", err)
	}
	_, _, err = oneKindNamed("scale", []string{"ms,mp"})
	if err == nil || !strings.Contains(err.Error(), "scale works on one kind at a time") {
		t.Errorf("a list of kinds: %v", err)
	}
}

func TestClaimName(t *testing.T) {
	for arg, want := range map[string]string{"job-42": "job-42", "mc/job-42": "job-42", "machineclaim/job-42": "job-42", "claims/j": "j"} {
		if got, err := claimName(arg); err != nil || got != want {
			t.Errorf("claimName(%q) = %q, %v; want %q", arg, got, err, want)
		}
	}
	for arg, wantErr := range map[string]string{
		"mp/agents": `release works on claims; "mp/agents" names a machinepool (to delete it: kaironctl delete mp/agents)`,
		"mc/":       `"mc/" is not a CLAIM or mc/CLAIM`,
		"mc/a/b":    `"mc/a/b" is not a CLAIM or mc/CLAIM`,
		"pods/x":    `unknown kind "pods"`,
	} {
		if _, err := claimName(arg); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("claimName(%q): error %v, want %q", arg, err, wantErr)
		}
	}
}
