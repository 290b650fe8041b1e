package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// checkAddressesUnique fails the test if two Machines of the cluster
// report one address: the invariant issue 42's red team broke, and one
// every test that moves guests around checks at its end.
func checkAddressesUnique(t *testing.T, env *testenv.Env, when string) {
	t.Helper()
	var machines kaironv1.MachineList
	if err := env.Client.List(context.Background(), &machines); err != nil {
		t.Fatal(err)
	}
	holders := map[string][]string{}
	for _, m := range machines.Items {
		for _, a := range m.Status.Addresses {
			holders[a.Address] = append(holders[a.Address], m.Namespace+"/"+m.Name+" on "+m.Spec.NodeName)
		}
	}
	var shared []string
	for address, who := range holders {
		if len(who) > 1 {
			shared = append(shared, fmt.Sprintf("%s held by %s", address, strings.Join(who, " and ")))
		}
	}
	sort.Strings(shared)
	if len(shared) > 0 {
		t.Errorf("%s: one address, several Machines: %s", when, strings.Join(shared, "; "))
	}
}
