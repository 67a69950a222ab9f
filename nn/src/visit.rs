//! How a module describes itself: [`Visit`] (what `#[derive(Module)]`
//! implements), the [`Visitor`] it reports to, the [`ModuleField`] types a
//! module's fields may have, and [`walk`], which turns the description into
//! the dotted PyTorch names of the whole tree.

use tessera_autograd::Parameter;

use crate::{Buffer, Module, Training};

/// A value that can report its parameters, buffers, training flags and
/// child modules to a [`Visitor`]. `#[derive(Module)]` implements it from
/// the struct's fields; every [`Module`] has it.
pub trait Visit {
    /// Reports this module's own items (not its children's) to `visitor`,
    /// in field order, each under its local name.
    fn visit<'a>(&'a self, visitor: &mut dyn Visitor<'a>);

    /// The module's type name, as PyTorch prints it (`"Linear"`).
    fn type_name(&self) -> &'static str;
}

/// Receives what a module's [`Visit::visit`] reports. Names are local: a
/// field's name (or its `#[module(rename)]`), extended by `.0`, `.1`, ...
/// for the items of a `Vec` or array field.
pub trait Visitor<'a> {
    /// A trainable parameter.
    fn parameter(&mut self, name: &str, parameter: &'a Parameter);
    /// A buffer (persistent or not: see [`Buffer::is_persistent`]).
    fn buffer(&mut self, name: &str, buffer: &'a Buffer);
    /// A training-mode flag.
    fn training(&mut self, flag: &'a Training);
    /// A child module.
    fn child(&mut self, name: &str, module: &'a dyn Module);
}

/// A type a `#[derive(Module)]` struct's field may have: a [`Parameter`],
/// a [`Buffer`], a [`Training`] flag, any [`Module`] (including
/// `Box<dyn Module>`), and `Option`, `Vec` and arrays of these.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a module, parameter, buffer or training flag",
    label = "this field is not module state",
    note = "mark fields that are not module state with `#[module(skip)]`",
    note = "a train/eval flag is a `tessera_nn::Training` field, so that `train()` and `eval()` reach it"
)]
pub trait ModuleField {
    /// Reports the field under `name` (empty for a flattened field).
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>);
}

impl ModuleField for Parameter {
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        visitor.parameter(name, self);
    }
}

impl ModuleField for Buffer {
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        visitor.buffer(name, self);
    }
}

impl ModuleField for Training {
    fn visit_field<'a>(&'a self, _name: &str, visitor: &mut dyn Visitor<'a>) {
        visitor.training(self);
    }
}

impl<M: Module> ModuleField for M {
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        visitor.child(name, self);
    }
}

impl<T: ModuleField> ModuleField for Option<T> {
    /// Reports the value when present (an absent bias is not listed).
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        if let Some(v) = self {
            v.visit_field(name, visitor);
        }
    }
}

impl<T: ModuleField> ModuleField for Vec<T> {
    /// Reports item `i` as `name.i` (`i` when flattened), as PyTorch names
    /// the items of a `ModuleList` or `ParameterList`.
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        visit_items(self, name, visitor);
    }
}

impl<T: ModuleField, const N: usize> ModuleField for [T; N] {
    /// Reports item `i` as `name.i`, as for a `Vec`.
    fn visit_field<'a>(&'a self, name: &str, visitor: &mut dyn Visitor<'a>) {
        visit_items(self, name, visitor);
    }
}

fn visit_items<'a, T: ModuleField>(items: &'a [T], name: &str, visitor: &mut dyn Visitor<'a>) {
    for (i, item) in items.iter().enumerate() {
        item.visit_field(&join(name, &i.to_string()), visitor);
    }
}

impl<M: Module + ?Sized> Visit for Box<M> {
    fn visit<'a>(&'a self, visitor: &mut dyn Visitor<'a>) {
        (**self).visit(visitor);
    }

    fn type_name(&self) -> &'static str {
        (**self).type_name()
    }
}

/// One item of a module tree, as [`walk`] reports it.
#[derive(Clone, Copy)]
pub enum Entry<'a> {
    /// A parameter.
    Parameter(&'a Parameter),
    /// A buffer.
    Buffer(&'a Buffer),
    /// A training-mode flag (reported under its module's name).
    Training(&'a Training),
    /// A descendant module (reported before its own items).
    Module(&'a dyn Module),
}

/// Calls `f(name, entry)` for every item of `module` and its descendants
/// with its dotted PyTorch name, in `state_dict` order: each module's
/// parameters, then its buffers, then its training flags, then each child
/// (the child itself, then its items) in field order. `module` itself is
/// not reported; its own items have names without a prefix.
pub fn walk<'a, M: Visit + ?Sized>(module: &'a M, f: &mut dyn FnMut(&str, Entry<'a>)) {
    report("", Local::of(module), f);
}

fn report<'a>(prefix: &str, local: Local<'a>, f: &mut dyn FnMut(&str, Entry<'a>)) {
    for (name, p) in local.parameters {
        f(&join(prefix, &name), Entry::Parameter(p));
    }
    for (name, b) in local.buffers {
        f(&join(prefix, &name), Entry::Buffer(b));
    }
    for flag in local.flags {
        f(prefix, Entry::Training(flag));
    }
    for (name, child) in local.children {
        let path = join(prefix, &name);
        f(&path, Entry::Module(child));
        report(&path, Local::of(child), f);
    }
}

/// One module's own items, gathered so that they can be reported in
/// PyTorch's order whatever the field order.
#[derive(Default)]
struct Local<'a> {
    parameters: Vec<(String, &'a Parameter)>,
    buffers: Vec<(String, &'a Buffer)>,
    flags: Vec<&'a Training>,
    children: Vec<(String, &'a dyn Module)>,
}

impl<'a> Local<'a> {
    fn of<M: Visit + ?Sized>(module: &'a M) -> Local<'a> {
        let mut local = Local::default();
        module.visit(&mut local);
        local
    }
}

impl<'a> Visitor<'a> for Local<'a> {
    fn parameter(&mut self, name: &str, parameter: &'a Parameter) {
        self.parameters.push((name.to_string(), parameter));
    }

    fn buffer(&mut self, name: &str, buffer: &'a Buffer) {
        self.buffers.push((name.to_string(), buffer));
    }

    fn training(&mut self, flag: &'a Training) {
        self.flags.push(flag);
    }

    fn child(&mut self, name: &str, module: &'a dyn Module) {
        self.children.push((name.to_string(), module));
    }
}

/// `prefix.name`, or whichever of the two is not empty.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}.{name}"),
    }
}

#[cfg(test)]
#[path = "visit_tests.rs"]
mod tests;
