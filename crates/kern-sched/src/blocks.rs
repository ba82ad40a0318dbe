//! The KV page pool: a free list of page ids. A sequence holds the pages covering its context;
//! pages return to the pool when the sequence finishes.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("out of KV pages: {needed} more needed, {free} free of {total} ({page_tokens} tokens each)")]
    Exhausted { needed: usize, free: usize, total: usize, page_tokens: usize },
}

#[derive(Debug, Clone)]
pub struct BlockManager {
    page_tokens: usize,
    total: usize,
    free: Vec<u32>,
}

impl BlockManager {
    pub fn new(total_pages: usize, page_tokens: usize) -> Self {
        assert!(page_tokens > 0, "page_tokens must be positive");
        // Lowest ids handed out first (pop from the end).
        BlockManager { page_tokens, total: total_pages, free: (0..total_pages as u32).rev().collect() }
    }

    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }
    pub fn total_pages(&self) -> usize {
        self.total
    }

    /// The free pages (the next one handed out is the last).
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }

    /// Grows `pages` to cover `tokens` tokens; on failure nothing changes.
    pub fn ensure(&mut self, pages: &mut Vec<u32>, tokens: usize) -> Result<(), PageError> {
        let want = self.pages_for(tokens);
        if want <= pages.len() {
            return Ok(());
        }
        let needed = want - pages.len();
        if needed > self.free.len() {
            return Err(PageError::Exhausted { needed, free: self.free.len(), total: self.total, page_tokens: self.page_tokens });
        }
        for _ in 0..needed {
            pages.push(self.free.pop().expect("checked above"));
        }
        Ok(())
    }

    /// Returns a sequence's pages to the pool.
    pub fn release(&mut self, pages: &mut Vec<u32>) {
        self.free.append(pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_grow_release() {
        let mut b = BlockManager::new(4, 16);
        let mut p = Vec::new();
        b.ensure(&mut p, 17).unwrap();
        assert_eq!(p, vec![0, 1]);
        b.ensure(&mut p, 32).unwrap();
        assert_eq!(p.len(), 2);
        let mut q = Vec::new();
        let e = b.ensure(&mut q, 49).unwrap_err();
        assert_eq!(e, PageError::Exhausted { needed: 4, free: 2, total: 4, page_tokens: 16 });
        assert!(q.is_empty(), "a failed ensure takes nothing");
        b.release(&mut p);
        assert_eq!(b.free_pages(), 4);
        assert!(p.is_empty());
    }
}
