//! Integer expressions over the manifest's vars: shapes, grids, blocks, shared memory.
//!
//! Grammar (whitespace is free):
//!
//! ```text
//! expr  := term (("+" | "-") term)*
//! term  := unary (("*" | "/" | "%") unary)*
//! unary := "-" unary | atom
//! atom  := INTEGER | VAR | "(" expr ")"
//!        | "ceil" "(" expr "/" expr ")"      ceiling division
//!        | "cdiv" "(" expr "," expr ")"      ceiling division
//!        | ("min" | "max") "(" expr ("," expr)+ ")"
//! ```
//!
//! Values are `i64`. `/` and `%` floor (like Python: `-7/2 = -4`, `-7%2 = 1`). Overflow and
//! division by zero are errors at evaluation, never wrapped or panicked on. An expression is
//! parsed once, when the manifest is checked, with its variable names resolved to var indices.

use std::fmt;

/// Longest expression text accepted, and deepest nesting: both bound the parser's recursion.
const MAX_LEN: usize = 1024;
const MAX_DEPTH: usize = 64;

/// A parsed, var-resolved expression. `Display` prints the text it was written as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    text: String,
    node: Node,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Const(i64),
    Var(usize),
    Neg(Box<Node>),
    Bin(BinOp, Box<Node>, Box<Node>),
    Call(Func, Vec<Node>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    CeilDiv,
    Min,
    Max,
}

/// Names an expression may not use for vars.
pub const FUNCTIONS: &[&str] = &["ceil", "cdiv", "min", "max"];

/// Why an expression could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("`{text}` is not an expression: {reason}")]
    Syntax { text: String, reason: String },
    /// The expression names vars the manifest does not declare.
    #[error("{}", undeclared_message(.text, .names))]
    UndeclaredVars { text: String, names: Vec<String> },
}

fn undeclared_message(text: &str, names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match names {
        [one] if one == text.trim() => format!("var `{one}` is not declared in `vars`"),
        [_] => format!(
            "`{text}` uses var {}, which is not declared in `vars`",
            quoted[0]
        ),
        _ => format!(
            "`{text}` uses vars {}, which are not declared in `vars`",
            quoted.join(", ")
        ),
    }
}

/// Why an expression could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("`{0}` divides by zero")]
    DivisionByZero(String),
    #[error("`{0}` overflows a 64-bit integer")]
    Overflow(String),
    #[error("`{0}` needs a value for var #{1}, which was not given")]
    MissingVar(String, usize),
}

impl Expr {
    /// Parses `text`, resolving each variable name through `var` (name → var index).
    pub fn parse(text: &str, var: impl Fn(&str) -> Option<usize>) -> Result<Expr, ParseError> {
        let syntax = |reason: String| ParseError::Syntax {
            text: text.to_string(),
            reason,
        };
        if text.len() > MAX_LEN {
            return Err(syntax(format!("longer than {MAX_LEN} characters")));
        }
        let tokens = lex(text).map_err(syntax)?;
        let mut p = Parser {
            tokens: &tokens,
            pos: 0,
            depth: 0,
            var: &var,
            undeclared: vec![],
        };
        let node = p.expr().map_err(syntax)?;
        if let Some(t) = p.peek() {
            return Err(syntax(format!("unexpected `{t}` after the expression")));
        }
        if !p.undeclared.is_empty() {
            return Err(ParseError::UndeclaredVars {
                text: text.to_string(),
                names: p.undeclared,
            });
        }
        Ok(Expr {
            text: text.to_string(),
            node,
        })
    }

    /// A constant expression.
    pub fn constant(v: i64) -> Expr {
        Expr {
            text: v.to_string(),
            node: Node::Const(v),
        }
    }

    /// Evaluates with `vars[i]` the value of var `i`.
    pub fn eval(&self, vars: &[i64]) -> Result<i64, EvalError> {
        eval(&self.node, vars).map_err(|e| match e {
            Fail::DivZero => EvalError::DivisionByZero(self.text.clone()),
            Fail::Overflow => EvalError::Overflow(self.text.clone()),
            Fail::Missing(i) => EvalError::MissingVar(self.text.clone(), i),
        })
    }

    /// The value, when the expression uses no vars (and evaluates).
    pub fn as_const(&self) -> Option<i64> {
        if self.uses_vars() {
            None
        } else {
            self.eval(&[]).ok()
        }
    }

    pub fn uses_vars(&self) -> bool {
        !self.vars().is_empty()
    }

    /// The var indices used, in first-use order, without repeats.
    pub fn vars(&self) -> Vec<usize> {
        let mut out = vec![];
        collect_vars(&self.node, &mut out);
        out
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn collect_vars(n: &Node, out: &mut Vec<usize>) {
    match n {
        Node::Const(_) => {}
        Node::Var(v) => {
            if !out.contains(v) {
                out.push(*v)
            }
        }
        Node::Neg(a) => collect_vars(a, out),
        Node::Bin(_, a, b) => {
            collect_vars(a, out);
            collect_vars(b, out);
        }
        Node::Call(_, args) => args.iter().for_each(|a| collect_vars(a, out)),
    }
}

enum Fail {
    DivZero,
    Overflow,
    Missing(usize),
}

fn eval(n: &Node, vars: &[i64]) -> Result<i64, Fail> {
    Ok(match n {
        Node::Const(c) => *c,
        Node::Var(v) => *vars.get(*v).ok_or(Fail::Missing(*v))?,
        Node::Neg(a) => eval(a, vars)?.checked_neg().ok_or(Fail::Overflow)?,
        Node::Bin(op, a, b) => {
            let (a, b) = (eval(a, vars)?, eval(b, vars)?);
            match op {
                BinOp::Add => a.checked_add(b).ok_or(Fail::Overflow)?,
                BinOp::Sub => a.checked_sub(b).ok_or(Fail::Overflow)?,
                BinOp::Mul => a.checked_mul(b).ok_or(Fail::Overflow)?,
                BinOp::Div => floor_div(a, b)?,
                BinOp::Rem => {
                    let q = floor_div(a, b)?;
                    a.checked_sub(q.checked_mul(b).ok_or(Fail::Overflow)?)
                        .ok_or(Fail::Overflow)?
                }
            }
        }
        Node::Call(f, args) => {
            let vals = args
                .iter()
                .map(|a| eval(a, vars))
                .collect::<Result<Vec<_>, _>>()?;
            match f {
                Func::CeilDiv => ceil_div(vals[0], vals[1])?,
                Func::Min => vals.into_iter().min().unwrap_or(0),
                Func::Max => vals.into_iter().max().unwrap_or(0),
            }
        }
    })
}

fn floor_div(a: i64, b: i64) -> Result<i64, Fail> {
    if b == 0 {
        return Err(Fail::DivZero);
    }
    let q = a.checked_div(b).ok_or(Fail::Overflow)?;
    Ok(if a % b != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

fn ceil_div(a: i64, b: i64) -> Result<i64, Fail> {
    if b == 0 {
        return Err(Fail::DivZero);
    }
    let q = a.checked_div(b).ok_or(Fail::Overflow)?;
    Ok(if a % b != 0 && ((a < 0) == (b < 0)) {
        q + 1
    } else {
        q
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Int(i64),
    Ident(String),
    Sym(char),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Int(i) => write!(f, "{i}"),
            Tok::Ident(s) => f.write_str(s),
            Tok::Sym(c) => write!(f, "{c}"),
        }
    }
}

fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let mut out = vec![];
    let mut chars = text.char_indices().peekable();
    while let Some(&(i, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c.is_ascii_digit() {
            let mut end = i;
            while let Some(&(j, d)) = chars.peek() {
                if !d.is_ascii_alphanumeric() && d != '_' && d != '.' {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            let lit = &text[i..end];
            let v = lit.parse::<i64>().map_err(|_| {
                if lit.chars().all(|d| d.is_ascii_digit()) {
                    format!("{lit} does not fit in a 64-bit integer")
                } else {
                    format!("`{lit}` is not an integer")
                }
            })?;
            out.push(Tok::Int(v));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut end = i;
            while let Some(&(j, d)) = chars.peek() {
                if !d.is_ascii_alphanumeric() && d != '_' {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            out.push(Tok::Ident(text[i..end].to_string()));
        } else if "+-*/%(),".contains(c) {
            out.push(Tok::Sym(c));
            chars.next();
        } else {
            return Err(format!("unexpected character `{c}` (expressions use integers, vars, + - * / %, parentheses, ceil, cdiv, min, max)"));
        }
    }
    if out.is_empty() {
        return Err("it is empty".into());
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: &'a [Tok],
    pos: usize,
    depth: usize,
    var: &'a dyn Fn(&str) -> Option<usize>,
    undeclared: Vec<String>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            return Ok(());
        }
        match self.peek() {
            Some(t) => Err(format!("expected `{c}`, found `{t}`")),
            None => Err(format!("expected `{c}` at the end")),
        }
    }

    fn expr(&mut self) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let mut lhs = self.term()?;
        loop {
            let op = if self.eat('+') {
                BinOp::Add
            } else if self.eat('-') {
                BinOp::Sub
            } else {
                break;
            };
            let rhs = self.term()?;
            lhs = Node::Bin(op, Box::new(lhs), Box::new(rhs));
        }
        self.depth -= 1;
        Ok(lhs)
    }

    fn term(&mut self) -> Result<Node, String> {
        let mut lhs = self.unary()?;
        loop {
            let op = if self.eat('*') {
                BinOp::Mul
            } else if self.eat('/') {
                BinOp::Div
            } else if self.eat('%') {
                BinOp::Rem
            } else {
                break;
            };
            let rhs = self.unary()?;
            lhs = Node::Bin(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Node, String> {
        if self.eat('-') {
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err(format!("nested deeper than {MAX_DEPTH} levels"));
            }
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(match inner {
                Node::Const(c) => Node::Const(c.checked_neg().ok_or("a constant overflows")?),
                n => Node::Neg(Box::new(n)),
            });
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Node, String> {
        let Some(tok) = self.peek().cloned() else {
            return Err("it ends where a value was expected".into());
        };
        self.pos += 1;
        match tok {
            Tok::Int(v) => Ok(Node::Const(v)),
            Tok::Sym('(') => {
                let e = self.expr()?;
                self.expect(')')?;
                Ok(e)
            }
            Tok::Sym(c) => Err(format!("unexpected `{c}`")),
            Tok::Ident(name) if self.peek() == Some(&Tok::Sym('(')) => self.call(&name),
            Tok::Ident(name) if FUNCTIONS.contains(&name.as_str()) => {
                Err(format!("`{name}` is a function: write {name}(…)"))
            }
            Tok::Ident(name) => match (self.var)(&name) {
                Some(i) => Ok(Node::Var(i)),
                None => {
                    if !self.undeclared.contains(&name) {
                        self.undeclared.push(name);
                    }
                    Ok(Node::Var(usize::MAX))
                }
            },
        }
    }

    fn call(&mut self, name: &str) -> Result<Node, String> {
        self.expect('(')?;
        let mut args = vec![self.expr()?];
        while self.eat(',') {
            args.push(self.expr()?);
        }
        self.expect(')')?;
        match (name, args.len()) {
            ("ceil", 1) => match args.pop() {
                Some(Node::Bin(BinOp::Div, a, b)) => Ok(Node::Call(Func::CeilDiv, vec![*a, *b])),
                _ => Err(
                    "ceil takes one division, as in ceil(tokens/64); values are integers".into(),
                ),
            },
            ("ceil", n) => Err(format!(
                "ceil takes one division, as in ceil(tokens/64), not {n} arguments"
            )),
            ("cdiv", 2) => Ok(Node::Call(Func::CeilDiv, args)),
            ("cdiv", n) => Err(format!("cdiv takes 2 arguments, not {n}")),
            ("min", n) | ("max", n) if n < 2 => Err(format!("{name} takes at least 2 arguments")),
            ("min", _) => Ok(Node::Call(Func::Min, args)),
            ("max", _) => Ok(Node::Call(Func::Max, args)),
            _ => Err(format!(
                "unknown function `{name}` (functions: ceil, cdiv, min, max)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<usize> {
        ["tokens", "seqs", "n"].iter().position(|v| *v == name)
    }

    fn ev(text: &str, values: &[i64]) -> Result<i64, EvalError> {
        Expr::parse(text, vars).unwrap().eval(values)
    }

    #[test]
    fn precedence_and_associativity() {
        let v = [10, 3, 0];
        assert_eq!(ev("1 + 2 * 3", &v), Ok(7));
        assert_eq!(ev("(1 + 2) * 3", &v), Ok(9));
        assert_eq!(ev("10 - 4 - 3", &v), Ok(3));
        assert_eq!(ev("100 / 10 / 5", &v), Ok(2));
        assert_eq!(ev("tokens*2 + seqs", &v), Ok(23));
        assert_eq!(ev("seqs*2", &v), Ok(6));
        assert_eq!(ev("-tokens + 1", &v), Ok(-9));
        assert_eq!(ev("2 - -3", &v), Ok(5));
        assert_eq!(ev("tokens % 4 * 2", &v), Ok(4));
        assert_eq!(ev("2560", &v), Ok(2560));
    }

    #[test]
    fn floor_and_ceil() {
        let v = [130, 7, 0];
        assert_eq!(ev("ceil(tokens/64)", &v), Ok(3));
        assert_eq!(ev("cdiv(tokens, 64)", &v), Ok(3));
        assert_eq!(ev("ceil(128/64)", &v), Ok(2));
        assert_eq!(ev("tokens/64", &v), Ok(2));
        assert_eq!(ev("-7/2", &v), Ok(-4));
        assert_eq!(ev("-7%2", &v), Ok(1));
        assert_eq!(ev("7%-2", &v), Ok(-1));
        assert_eq!(ev("cdiv(-7, 2)", &v), Ok(-3));
        assert_eq!(ev("min(tokens, 64, seqs)", &v), Ok(7));
        assert_eq!(ev("max(tokens, seqs*100)", &v), Ok(700));
        assert_eq!(ev("ceil((tokens+1)/(seqs-5))", &v), Ok(66));
    }

    #[test]
    fn evaluation_errors_name_the_expression() {
        assert_eq!(
            ev("tokens/(seqs-seqs)", &[1, 2, 0]),
            Err(EvalError::DivisionByZero("tokens/(seqs-seqs)".into()))
        );
        assert_eq!(
            ev("ceil(tokens/n)", &[1, 2, 0]).unwrap_err().to_string(),
            "`ceil(tokens/n)` divides by zero"
        );
        assert_eq!(
            ev("tokens % 0", &[1, 2, 0]).unwrap_err(),
            EvalError::DivisionByZero("tokens % 0".into())
        );
        assert_eq!(
            ev("tokens * 9223372036854775807", &[2, 0, 0]),
            Err(EvalError::Overflow("tokens * 9223372036854775807".into()))
        );
        assert_eq!(
            ev("-9223372036854775807 - 1 - 1", &[]),
            Err(EvalError::Overflow("-9223372036854775807 - 1 - 1".into()))
        );
        assert!(matches!(
            ev("tokens", &[]),
            Err(EvalError::MissingVar(_, 0))
        ));
    }

    #[test]
    fn syntax_errors() {
        let err = |t: &str| Expr::parse(t, vars).unwrap_err().to_string();
        assert_eq!(err(""), "`` is not an expression: it is empty");
        assert!(err("tokens +").contains("ends where a value was expected"));
        assert!(err("(tokens").contains("expected `)`"));
        assert!(err("tokens seqs").contains("unexpected `seqs` after the expression"));
        assert!(err("ceil(tokens)").contains("ceil takes one division"));
        assert!(err("floor(tokens)").contains("unknown function `floor`"));
        assert!(err("tokens ** 2").contains("unexpected `*`"));
        assert!(err("1.5").contains("`1.5` is not an integer"));
        assert!(err("99999999999999999999").contains("does not fit in a 64-bit integer"));
        assert!(err("12abc").contains("`12abc` is not an integer"));
        assert!(err("min(tokens)").contains("at least 2 arguments"));
        assert!(err("tokens & 1").contains("unexpected character `&`"));
        assert!(err("max").contains("is a function"));
        assert_eq!(
            err("tokens*seq + batch + seq"),
            "`tokens*seq + batch + seq` uses vars `seq`, `batch`, which are not declared in `vars`"
        );
        assert_eq!(
            err("ceil(toks/64)"),
            "`ceil(toks/64)` uses var `toks`, which is not declared in `vars`"
        );
        assert_eq!(err("toks"), "var `toks` is not declared in `vars`");
    }

    #[test]
    fn hostile_expressions_are_refused_cleanly() {
        let deep = "(".repeat(10_000) + "1" + &")".repeat(10_000);
        assert!(Expr::parse(&deep, vars)
            .unwrap_err()
            .to_string()
            .contains("longer than 1024"));
        let deep = "(".repeat(500) + "1" + &")".repeat(500);
        assert!(Expr::parse(&deep, vars)
            .unwrap_err()
            .to_string()
            .contains("nested deeper than 64"));
        let negs = "-".repeat(1000) + "1";
        assert!(Expr::parse(&negs, vars)
            .unwrap_err()
            .to_string()
            .contains("nested deeper than 64"));
        let ok = "(".repeat(60) + "1" + &")".repeat(60);
        assert_eq!(Expr::parse(&ok, vars).unwrap().as_const(), Some(1));
    }

    #[test]
    fn vars_used_and_constants() {
        let e = Expr::parse("seqs*2 + tokens - seqs", vars).unwrap();
        assert_eq!(e.vars(), [1, 0]);
        assert_eq!(e.as_const(), None);
        assert_eq!(
            Expr::parse("ceil(2560/64)*2", vars).unwrap().as_const(),
            Some(80)
        );
        assert_eq!(Expr::constant(-3).to_string(), "-3");
    }
}
