package image

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// modName is a module's canonical name: the kernel treats '-' and '_' alike.
func modName(s string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(s), ".ko"), "-", "_")
}

// ResolveModules returns the module files (relative to modDir) that load
// the named modules, each after the modules it depends on. Debian's package
// ships no modules.dep (depmod runs at install), so dependencies come from
// each module's own .modinfo section. A module in modules.builtin is part of
// the kernel and skipped; one that is neither is an error.
func ResolveModules(modDir string, names []string) ([]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			rel, err := filepath.Rel(modDir, p)
			if err != nil {
				return err
			}
			files[modName(p)] = rel
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("image: list modules: %w", err)
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, line := range strings.Fields(string(b)) {
			builtin[modName(line)] = true
		}
	}

	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = modName(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("image: module dependency cycle at %s", name)
		case 2:
			return nil
		}
		rel, ok := files[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("image: module %s (needed by %s) is not in %s", name, from, modDir)
			}
			return fmt.Errorf("image: module %s is not in %s", name, modDir)
		}
		state[name] = 1
		deps, err := moduleDepends(filepath.Join(modDir, rel))
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, rel)
		return nil
	}
	for _, n := range names {
		if err := visit(n, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleDepends reads the depends= entry of a module's .modinfo section.
func moduleDepends(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, fmt.Errorf("image: module %s: %w", p, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("image: module %s: %w", p, err)
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, d)
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}
