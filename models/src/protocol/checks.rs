//! What the model checks in a state: its invariants, and liveness by a fair completion.

use super::model::*;

impl Protocol {
    /// State invariants: reverse index, one probe per generation.
    pub(super) fn invariants(&self, state: &State) -> Result<(), String> {
        for (&key, entry) in &state.keys {
            for request in &entry.requesters {
                if !state
                    .reverse
                    .get(request)
                    .is_some_and(|keys| keys.contains(&key))
                {
                    return Err(format!(
                        "reverse index: request {request} holds key {key} unindexed"
                    ));
                }
            }
            let id = (key, entry.generation);
            let batched = state
                .batch
                .iter()
                .filter(|&&(_, k, g)| (k, g) == id)
                .count();
            let probing = state.worker.iter().flatten().filter(|&&e| e == id).count()
                + state
                    .published
                    .iter()
                    .filter(|&&(k, g, _, _)| (k, g) == id)
                    .count();
            let (want_batched, want_probing) = match entry.phase {
                Phase::Pending => (1, 0),
                Phase::InFlight | Phase::Overdue => (0, 1),
                Phase::Resolved(_) => (0, 0),
            };
            if (batched, probing) != (want_batched, want_probing) {
                return Err(format!(
                    "key {key} generation {} in {:?}: {batched} batch entries, {probing} probes",
                    entry.generation, entry.phase
                ));
            }
        }
        // A probe is shared: a key is never probed twice at a time, whatever
        // the generations.
        for key in 0..self.bounds.keys {
            let held = |k: u8, g: u8| k == key && !state.released.contains(&(k, g));
            let probes = state
                .worker
                .iter()
                .flatten()
                .filter(|&&(k, g)| held(k, g))
                .count()
                + state
                    .published
                    .iter()
                    .filter(|&&(k, g, _, given_up)| held(k, g) && !given_up)
                    .count();
            if probes > 1 {
                return Err(format!("key {key} probed {probes} times at once"));
            }
        }
        if let Some(bound) = self.bounds.max_outstanding {
            let outstanding = Self::outstanding(state);
            if outstanding > usize::from(bound) {
                return Err(format!(
                    "outstanding: {outstanding} keys pending or with the worker, bound {bound}"
                ));
            }
        }
        for (request, keys) in &state.reverse {
            for key in keys {
                if !state
                    .keys
                    .get(key)
                    .is_some_and(|e| e.requesters.contains(request))
                {
                    return Err(format!(
                        "reverse index: request {request} lists key {key} it does not hold"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Liveness, by a fair completion from `state`.
    pub(super) fn liveness(&self, state: &State) -> Result<(), String> {
        // Every request holding a key gets a verdict once the worker delivers.
        let mut done = state.clone();
        self.complete(&mut done)?;
        for (&key, entry) in &state.keys {
            for &request in &entry.requesters {
                let mut asked = done.clone();
                self.step(&mut asked, &Action::Lookup { key, request })?;
                if !matches!(
                    asked.keys.get(&key).map(|e| e.phase),
                    Some(Phase::Resolved(_) | Phase::Overdue)
                ) {
                    return Err(format!(
                        "liveness: request {request} has no verdict for key {key} after every delivery"
                    ));
                }
            }
        }
        // Nothing survives all cleanups and deliveries.
        let mut gone = state.clone();
        for request in 0..self.bounds.requests {
            self.step(&mut gone, &Action::Cleanup { request })?;
        }
        self.complete(&mut gone)?;
        if !gone.keys.is_empty() {
            return Err(format!(
                "liveness: {} key states survive every cleanup and delivery",
                gone.keys.len()
            ));
        }
        Ok(())
    }

    /// Flush, deliver every group (all misses), apply.
    pub(super) fn complete(&self, state: &mut State) -> Result<(), String> {
        if !state.batch.is_empty() {
            self.step(state, &Action::Flush)?;
        }
        while let Some(entries) = state.worker.first() {
            let found = vec![false; entries.len()];
            self.step(state, &Action::Deliver { group: 0, found })?;
        }
        if !state.published.is_empty() {
            self.step(state, &Action::Apply)?;
        }
        Ok(())
    }
}
