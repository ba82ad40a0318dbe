//! The ChatML prompt format, for models whose chat template is ChatML (`<|im_start|>ROLE`
//! newline CONTENT `<|im_end|>` newline, per message): the fallback for a tokenizer without a
//! chat template. Models' own Jinja templates are rendered by [`crate::ChatTemplate`].

/// The ChatML prompt of `messages` (role, content), ending with the assistant's turn opened
/// for generation: `<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n`.
pub fn chatml(messages: &[(&str, &str)]) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str("<|im_start|>");
        s.push_str(role);
        s.push('\n');
        s.push_str(content);
        s.push_str("<|im_end|>\n");
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_messages_then_the_open_assistant_turn() {
        assert_eq!(
            super::chatml(&[("system", "Be brief."), ("user", "Hi")]),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(super::chatml(&[]), "<|im_start|>assistant\n");
    }
}
