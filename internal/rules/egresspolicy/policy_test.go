package egresspolicy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestPatternMatch(t *testing.T) {
	cases := []struct {
		pattern Pattern
		name    string
		want    bool
	}{
		{"pkg.test", "pkg.test", true},
		{"pkg.test", "PKG.Test.", true},
		{"pkg.test", "a.pkg.test", false},
		{"pkg.test", "pkg.test.evil", false},
		{"*.pkg.test", "a.pkg.test", true},
		{"*.pkg.test", "a.b.pkg.test", true},
		{"*.pkg.test", "pkg.test", false},
		{"*.pkg.test", "evilpkg.test", false},
		{"*.pkg.test", ".pkg.test", false},
	}
	for _, c := range cases {
		if got := c.pattern.Match(c.name); got != c.want {
			t.Errorf("%q.Match(%q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
}

func TestCompile(t *testing.T) {
	type pol = NamedPolicy
	type rules = kaironv1.EgressRules
	cases := []struct {
		name     string
		policies []NamedPolicy
		want     *Policy
	}{
		{"no policy: unconfined", nil, nil},
		{"empty policy: deny all", []pol{{"a", rules{}}}, &Policy{}},
		{"ports alone open nothing", []pol{{"a", rules{AllowPorts: []kaironv1.PortRange{"443"}, AllowIcmp: true}}}, &Policy{}},
		{"cidrs v4 and v6, masked and sorted, ports merged", []pol{{"a", rules{
			AllowCidrs: []kaironv1.CIDR{"2001:db8::1/32", "10.1.2.3/8", "10.0.0.0/8"},
			AllowPorts: []kaironv1.PortRange{"8000-8100", "443", "8050-8200", "444", "22"},
		}}}, &Policy{Grants: []Grant{{
			Nets:  []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")},
			Ports: []PortRange{{22, 22}, {443, 444}, {8000, 8200}},
		}}}},
		{"fqdns: dns falls back to them, canonical", []pol{{"a", rules{
			AllowFqdns: []kaironv1.Hostname{"PKG.test.", "pkg.test"},
			AllowSNI:   []kaironv1.ServerName{"*.pkg.test"},
		}}}, &Policy{
			Grants: []Grant{{FQDNs: []Pattern{"pkg.test"}, SNI: []Pattern{"*.pkg.test"}}},
			DNS:    []Pattern{"pkg.test"},
		}},
		{"allowDNS replaces the fallback", []pol{{"a", rules{
			AllowFqdns: []kaironv1.Hostname{"pkg.test"},
			AllowDNS:   []kaironv1.ServerName{"*.internal.test"},
		}}}, &Policy{
			Grants: []Grant{{FQDNs: []Pattern{"pkg.test"}}},
			DNS:    []Pattern{"*.internal.test"},
		}},
		{"union keeps grants apart, sorted by policy name", []pol{
			{"b", rules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"80"}}},
			{"a", rules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowIcmp: true}},
			{"c", rules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowIcmp: true}},
		}, &Policy{
			Grants: []Grant{
				{Nets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: []PortRange{{443, 443}}, ICMP: true},
				{FQDNs: []Pattern{"pkg.test"}, Ports: []PortRange{{80, 80}}},
			},
			DNS: []Pattern{"pkg.test"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Compile(c.policies)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Compile = %+v\nwant      %+v", got, c.want)
			}
		})
	}
}

func TestCompileQueriesAndLearning(t *testing.T) {
	p, err := Compile([]NamedPolicy{
		{"a", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test"}, AllowPorts: []kaironv1.PortRange{"443"}}},
		{"b", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"*.cdn.test", "pkg.test"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"pkg.test": true, "x.cdn.test": true, "cdn.test": false, "other.test": false} {
		if got := p.AllowsQuery(name); got != want {
			t.Errorf("AllowsQuery(%q) = %v, want %v", name, got, want)
		}
	}
	if got := p.LearnFor("pkg.test"); len(got) != 2 || got[0] == got[1] {
		t.Errorf("LearnFor(pkg.test) = %v, want both grants", got)
	}
	if got := p.LearnFor("a.cdn.test"); len(got) != 1 || got[0] != p.Grants[1].ID() {
		t.Errorf("LearnFor(a.cdn.test) = %v, want only the second grant %s", got, p.Grants[1].ID())
	}
	if got := p.LearnFor("other.test"); len(got) != 0 {
		t.Errorf("LearnFor(other.test) = %v", got)
	}
}

func TestCompileRefusesBadInput(t *testing.T) {
	cases := []struct {
		rules kaironv1.EgressRules
		field string
	}{
		{kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8", "10.0.0.0/33"}}, "allowCidrs[1]"},
		{kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"pkg.test"}}, "allowCidrs[0]"},
		{kaironv1.EgressRules{AllowPorts: []kaironv1.PortRange{"0"}}, "allowPorts[0]"},
		{kaironv1.EgressRules{AllowPorts: []kaironv1.PortRange{"443", "65536"}}, "allowPorts[1]"},
		{kaironv1.EgressRules{AllowPorts: []kaironv1.PortRange{"9000-8000"}}, "allowPorts[0]"},
		{kaironv1.EgressRules{AllowPorts: []kaironv1.PortRange{"80 drop"}}, "allowPorts[0]"},
		{kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pkg.test", "a b.test"}}, "allowFqdns[1]"},
		{kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{`x"; flush ruleset`}}, "allowFqdns[0]"},
		{kaironv1.EgressRules{AllowSNI: []kaironv1.ServerName{"*"}}, "allowSNI[0]"},
		{kaironv1.EgressRules{AllowSNI: []kaironv1.ServerName{"a.*.test"}}, "allowSNI[0]"},
		{kaironv1.EgressRules{AllowDNS: []kaironv1.ServerName{"-bad.test"}}, "allowDNS[0]"},
		{kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{kaironv1.Hostname(strings.Repeat("a.", 130) + "test")}}, "allowFqdns[0]"},
	}
	for _, c := range cases {
		_, err := Compile([]NamedPolicy{{"ok", kaironv1.EgressRules{}}, {"bad", c.rules}})
		if err == nil {
			t.Errorf("Compile(%+v) accepted it", c.rules)
			continue
		}
		want := "MachineNetworkPolicy bad: spec.egress." + c.field
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Compile(%+v) = %q, want it to start with %q", c.rules, err, want)
		}
	}
}

func TestGrantIDFollowsContent(t *testing.T) {
	a := Grant{FQDNs: []Pattern{"pkg.test"}, Ports: []PortRange{{443, 443}}}
	b := Grant{FQDNs: []Pattern{"pkg.test"}, Ports: []PortRange{{443, 443}}}
	c := Grant{FQDNs: []Pattern{"pkg.test"}, Ports: []PortRange{{80, 80}}}
	if a.ID() != b.ID() || a.ID() == c.ID() || len(a.ID()) != 10 {
		t.Fatalf("IDs %s %s %s", a.ID(), b.ID(), c.ID())
	}
}
