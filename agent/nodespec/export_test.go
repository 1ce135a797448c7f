package nodespec

// Current is the spec converged on and its generation.
func (s *Store) Current() (int64, Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Generation, s.cur.Spec
}
