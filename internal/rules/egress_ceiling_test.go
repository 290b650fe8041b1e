package rules

import (
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestEgressWithin(t *testing.T) {
	ceiling := kaironv1.EgressRules{
		AllowFqdns: []kaironv1.Hostname{"pypi.org", "*.pythonhosted.org", "*.test"},
		AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8", "2001:db8::/32"},
		AllowPorts: []kaironv1.PortRange{"443", "8000-8100"},
	}
	for _, c := range []struct {
		name  string
		claim kaironv1.EgressRules
		want  string // "" when within; else a fragment of the error
	}{
		{"same as the ceiling", ceiling, ""},
		{"exact name", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, ""},
		{"name under a wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"files.pythonhosted.org", "A.B.Test."}, AllowPorts: []kaironv1.PortRange{"443"}}, ""},
		{"narrower wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"*.cdn.test"}, AllowPorts: []kaironv1.PortRange{"8050"}}, ""},
		{"the wildcard's own domain", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pythonhosted.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowFqdns[0]"},
		{"wider wildcard", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"*.org"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowFqdns[0]"},
		{"other name", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"evil.com"}, AllowPorts: []kaironv1.PortRange{"443"}}, `"evil.com"`},
		{"sub-CIDR", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.1.2.0/24", "2001:db8:1::/48"}, AllowPorts: []kaironv1.PortRange{"8000-8010"}}, ""},
		{"wider CIDR", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"0.0.0.0/0"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowCidrs[0]"},
		{"address outside", kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"192.168.1.1/32"}, AllowPorts: []kaironv1.PortRange{"443"}}, "allowCidrs[0]"},
		{"every port", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}}, "allowPorts is empty"},
		{"port range past the ceiling", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"8000-8200"}}, "allowPorts[0]"},
		{"ICMP", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowIcmp: true}, "allowIcmp"},
		{"SNI only narrows", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowSNI: []kaironv1.ServerName{"pypi.org"}}, ""},
		{"DNS past the ceiling", kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}, AllowPorts: []kaironv1.PortRange{"443"}, AllowDNS: []kaironv1.ServerName{"*.com"}}, `"*.com"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := EgressWithin(c.claim, ceiling)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one naming %s", err, c.want)
			}
		})
	}
	sni := kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowSNI: []kaironv1.ServerName{"*.corp.test"}}
	if err := EgressWithin(kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}}, sni); err == nil || !strings.Contains(err.Error(), "allowSNI is empty") {
		t.Errorf("a claim without allowSNI under a ceiling with it: %v", err)
	}
	if err := EgressWithin(kaironv1.EgressRules{AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"}, AllowSNI: []kaironv1.ServerName{"git.corp.test"}}, sni); err != nil {
		t.Errorf("a claim naming a server within the ceiling's allowSNI: %v", err)
	}
}
