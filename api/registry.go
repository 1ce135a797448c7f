package api

import (
	"fmt"
	"slices"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
)

// Served assembles the registry the server runs: every row of the method
// table, with the input schema of its descriptor where a domain serves it
// (a row with no descriptor is simply planned). A descriptor that disagrees
// with its row (action, decided-on or phase cell, kind), names no row, is
// given twice or has a handler that does not fit its kind is INVALID_CONFIG.
func Served(descriptors []rpc.Descriptor) (*core.Registry, map[string]*rpc.Handler, error) {
	table, err := core.TableMethods()
	if err != nil {
		return nil, nil, err
	}
	index := make(map[string]int, len(table))
	for i, m := range table {
		index[m.FullName()] = i
	}
	handlers := make(map[string]*rpc.Handler, len(descriptors))
	var problems []string
	for _, d := range descriptors {
		info, h := d.Info(), d.Handler()
		if err := describes(info, h, table, index, handlers); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		handlers[info.Name] = h
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return nil, nil, core.Errorf(core.CodeInvalidConfig, "method descriptors disagree with the method table: %v", problems).
			WithDetails(map[string]any{"problems": problems})
	}
	reg, err := core.NewRegistry(table...)
	if err != nil {
		return nil, nil, err
	}
	return reg, handlers, nil
}

// describes checks one descriptor against its row and, when it agrees,
// puts the method with the descriptor's input schema into table.
func describes(info rpc.Info, h *rpc.Handler, table []core.Method, index map[string]int, served map[string]*rpc.Handler) error {
	i, ok := index[info.Name]
	switch {
	case !ok:
		return fmt.Errorf("%s: no row of the method table", info.Name)
	case served[info.Name] != nil:
		return fmt.Errorf("%s: described twice", info.Name)
	}
	row := table[i].Row
	for _, c := range [][3]string{{"action", info.Action, row.Action}, {"decided on", info.DecidedOn, row.DecidedOn}, {"phase", info.Phase, row.Phase}} {
		if c[1] != c[2] {
			return fmt.Errorf("%s: %s %q, the table says %q", info.Name, c[0], c[1], c[2])
		}
	}
	if err := rpc.Check(info, h); err != nil {
		return err
	}
	schema, err := core.SchemaFor(info.Input)
	if err != nil {
		return fmt.Errorf("%s: %w", info.Name, err)
	}
	m, err := table[i].WithInput(schema)
	if err != nil {
		return fmt.Errorf("%s: %w", info.Name, err)
	}
	if m.Kind != info.Kind {
		return fmt.Errorf("%s: kind %s, the table derives %s", info.Name, info.Kind, m.Kind)
	}
	table[i] = m
	return nil
}

// BuildRegistry is the registry a server with these domains runs, built
// without dependencies (for checks such as doctor's).
func BuildRegistry(domains []rpc.Domain) (*core.Registry, error) {
	descriptors := (&Server{}).systemMethods()
	for _, domain := range domains {
		descriptors = append(descriptors, domain(rpc.Deps{})...)
	}
	reg, _, err := Served(descriptors)
	return reg, err
}
