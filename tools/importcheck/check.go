package main

import (
	"fmt"
	"slices"
	"strings"
)

// Violation is one import against a rule. Path runs from the package the
// rule governs to the forbidden import: one step for a direct import, the
// chain that pulls it in for a closure rule.
type Violation struct {
	Rule string
	Path []string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s", v.Rule, strings.Join(v.Path, " -> "))
}

// Check applies rules to the module's packages in pkgs (the others are
// their dependencies). Paths in violations are relative to the module.
func Check(pkgs []Package, rules []Rule) ([]Violation, error) {
	module := ""
	byPath := make(map[string]Package, len(pkgs))
	for _, p := range pkgs {
		byPath[p.ImportPath] = p
		if !p.DepOnly && p.Module != nil {
			module = p.Module.Path
		}
	}
	if module == "" {
		return nil, fmt.Errorf("no package of a module among the %d listed", len(pkgs))
	}
	m := matcher{module: module}
	var out []Violation
	for _, p := range pkgs {
		if !m.ours(p.ImportPath) {
			continue
		}
		for _, r := range rules {
			if !m.any(r.Scope, p.ImportPath) || m.any(r.Except, p.ImportPath) {
				continue
			}
			if r.Closure {
				for _, path := range forbiddenPaths(byPath, p.ImportPath, func(imp string) bool { return m.any(r.Never, imp) }) {
					out = append(out, Violation{Rule: r.Name, Path: m.rel(path)})
				}
				continue
			}
			for _, imp := range p.Imports {
				bad := m.any(r.Never, imp) || (len(r.Only) > 0 && m.ours(imp) && !m.any(r.Only, imp))
				if bad {
					out = append(out, Violation{Rule: r.Name, Path: m.rel([]string{p.ImportPath, imp})})
				}
			}
		}
	}
	return out, nil
}

// forbiddenPaths walks the imports from root breadth first and answers,
// for each package bad reports, the shortest chain that reaches it. It
// does not walk through a bad package: its own imports are its business.
func forbiddenPaths(pkgs map[string]Package, root string, bad func(string) bool) [][]string {
	parent := map[string]string{root: ""}
	queue := []string{root}
	var found []string
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, imp := range pkgs[cur].Imports {
			if _, seen := parent[imp]; seen {
				continue
			}
			parent[imp] = cur
			if bad(imp) {
				found = append(found, imp)
				continue
			}
			queue = append(queue, imp)
		}
	}
	slices.Sort(found)
	paths := make([][]string, 0, len(found))
	for _, f := range found {
		var path []string
		for p := f; p != ""; p = parent[p] {
			path = append(path, p)
		}
		slices.Reverse(path)
		paths = append(paths, path)
	}
	return paths
}

type matcher struct{ module string }

// abs turns a pattern relative to the module into an import path pattern.
func (m matcher) abs(pattern string) string {
	first, _, _ := strings.Cut(pattern, "/")
	switch {
	case pattern == "...":
		return m.module + "/..."
	case strings.Contains(first, "."):
		return pattern
	default:
		return m.module + "/" + pattern
	}
}

func (m matcher) match(pattern, path string) bool {
	pattern = m.abs(pattern)
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func (m matcher) any(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return m.match(p, path) })
}

func (m matcher) ours(path string) bool { return m.match("...", path) || path == m.module }

// rel shortens the module's import paths in path for reading.
func (m matcher) rel(path []string) []string {
	out := make([]string, len(path))
	for i, p := range path {
		out[i] = strings.TrimPrefix(p, m.module+"/")
	}
	return out
}
