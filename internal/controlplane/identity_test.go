package controlplane

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestComponentIdentities: kairon-controller and each node agent get their
// own client certificate (not the admin's), signed by the data dir's CA,
// kept across starts and made again when its files are gone.
func TestComponentIdentities(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	p, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		kp         *keyPair
		user, org  string
		notMasters bool
	}{
		{"controller", p.controller, ControllerUser, ControllersGroup, true},
		{"kubelet client", p.kubeletClient, APIServerKubeletClientUser, "", true},
	} {
		if got := c.kp.cert.Subject.CommonName; got != c.user {
			t.Errorf("%s certificate: CN %q, want %q", c.name, got, c.user)
		}
		if orgs := c.kp.cert.Subject.Organization; slices.Contains(orgs, "system:masters") || (c.org != "" && !slices.Equal(orgs, []string{c.org})) {
			t.Errorf("%s certificate: organizations %v, want [%s] and never system:masters", c.name, orgs, c.org)
		}
		if err := c.kp.cert.CheckSignatureFrom(p.ca.cert); err != nil {
			t.Errorf("%s certificate not signed by the CA: %v", c.name, err)
		}
	}

	node, err := ensureLeaf(dir, p.ca, nodeLeafSpec("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if node.cert.Subject.CommonName != NodeUserPrefix+"node-1" || !slices.Equal(node.cert.Subject.Organization, []string{NodesGroup}) ||
		!slices.Equal(node.cert.DNSNames, []string{"node-1"}) {
		t.Errorf("node certificate: CN %q O %v DNS %v, want %s, [%s], [node-1]",
			node.cert.Subject.CommonName, node.cert.Subject.Organization, node.cert.DNSNames, NodeUserPrefix+"node-1", NodesGroup)
	}
	again, err := ensureLeaf(dir, p.ca, nodeLeafSpec("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(node.certPEM, again.certPEM) {
		t.Error("node certificate reissued although still valid")
	}

	// A data dir from before per-component identities, or one whose files
	// were deleted: the next start makes them.
	for _, f := range []string{"kairon-controller.crt", "kairon-controller.key", "node-node-1.crt"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	p2, err := ensurePKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(p2.controller.certPEM, p.controller.certPEM) || p2.controller.cert.Subject.CommonName != ControllerUser {
		t.Error("deleted controller certificate was not made again")
	}
	remade, err := ensureLeaf(dir, p2.ca, nodeLeafSpec("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(remade.certPEM, node.certPEM) || !bytes.Equal(p2.ca.certPEM, p.ca.certPEM) {
		t.Error("deleted node certificate was not made again under the same CA")
	}
}
