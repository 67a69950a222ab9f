//! # tessera-derive
//!
//! `#[derive(Module)]` for `tessera-nn`: implements `tessera_nn::Visit` for
//! a struct from its fields, so a module's parameters, buffers, training
//! flags and children are described by construction and never by a list
//! kept by hand. Use it through `tessera_nn::Module` or
//! `tessera::prelude::*`; the documentation with examples is on
//! `tessera_nn::Module`.
//!
//! Every field is visited in declaration order under its name (tuple
//! fields under `0`, `1`, ...), unless marked:
//!
//! - `#[module(skip)]`: not module state (a dimension, a flag, an epsilon).
//!   A field that is neither state nor skipped is a compile error naming
//!   the field, so a forgotten child cannot compile.
//! - `#[module(rename = "name")]`: the state-dict name differs from the
//!   field's (PyTorch's `in_proj_weight` for a field `in_proj`).
//! - `#[module(flatten)]`: the field adds no name component, so the items
//!   of a `Vec` field `layers` are named `0`, `1`, ... as in a
//!   `torch.nn.Sequential`.
//!
//! On the struct: `#[module(type_name = "Linear")]` (any expression of
//! type `&'static str`, `self` in scope) sets the name `type_name()`
//! returns, the struct's name by default; `#[module(crate = path)]` names
//! the `tessera-nn` crate when it is not a direct dependency called
//! `tessera_nn` (the facade's re-export sets it).

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{parse_macro_input, Data, DeriveInput, Expr, Fields, LitStr, Path};

/// Implements `tessera_nn::Visit` from the struct's fields; see the crate
/// docs for the attributes. Generated code names the crate `::tessera_nn`.
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    expand(
        parse_macro_input!(input as DeriveInput),
        syn::parse_quote!(::tessera_nn),
    )
}

/// The same derive for users of the `tessera` facade: generated code names
/// the crate `::tessera::nn`. The facade re-exports it as `Module`.
#[doc(hidden)]
#[proc_macro_derive(FacadeModule, attributes(module))]
pub fn derive_facade_module(input: TokenStream) -> TokenStream {
    expand(
        parse_macro_input!(input as DeriveInput),
        syn::parse_quote!(::tessera::nn),
    )
}

fn expand(input: DeriveInput, default_crate: Path) -> TokenStream {
    match generate(&input, default_crate) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// The `#[module(...)]` settings of the struct.
struct StructAttrs {
    type_name: Option<Expr>,
    krate: Option<Path>,
}

/// The `#[module(...)]` settings of one field.
#[derive(Default)]
struct FieldAttrs {
    skip: bool,
    rename: Option<LitStr>,
    flatten: bool,
}

fn generate(input: &DeriveInput, default_crate: Path) -> syn::Result<TokenStream2> {
    let attrs = struct_attrs(input)?;
    let krate = attrs.krate.unwrap_or(default_crate);
    let fields = match &input.data {
        Data::Struct(s) => &s.fields,
        Data::Enum(e) => {
            return Err(syn::Error::new(
                e.enum_token.span(),
                "derive(Module) supports structs only: give each variant's modules a struct",
            ))
        }
        Data::Union(u) => {
            return Err(syn::Error::new(
                u.union_token.span(),
                "derive(Module) supports structs only",
            ))
        }
    };
    let mut visits = Vec::new();
    let mut bounds = Vec::new();
    let members: Vec<(syn::Member, &syn::Field)> = match fields {
        Fields::Named(n) => n
            .named
            .iter()
            .map(|f| (syn::Member::Named(f.ident.clone().expect("named field")), f))
            .collect(),
        Fields::Unnamed(u) => u
            .unnamed
            .iter()
            .enumerate()
            .map(|(i, f)| (syn::Member::Unnamed(i.into()), f))
            .collect(),
        Fields::Unit => Vec::new(),
    };
    for (member, field) in &members {
        let fa = field_attrs(field)?;
        if fa.skip {
            if fa.rename.is_some() || fa.flatten {
                return Err(syn::Error::new(
                    field.span(),
                    "a skipped field cannot also be renamed or flattened",
                ));
            }
            continue;
        }
        let name = match (&fa.rename, fa.flatten) {
            (Some(r), false) => r.value(),
            (None, true) => String::new(),
            (None, false) => match member {
                syn::Member::Named(id) => id.to_string().trim_start_matches("r#").to_string(),
                syn::Member::Unnamed(i) => i.index.to_string(),
            },
            (Some(r), true) => {
                return Err(syn::Error::new(
                    r.span(),
                    "rename and flatten exclude each other (flatten is an empty name)",
                ))
            }
        };
        let ty = &field.ty;
        // Spanned at the field's type, so an unsupported type is reported
        // at the field that holds it.
        visits.push(quote_spanned! {ty.span()=>
            #krate::ModuleField::visit_field(&self.#member, #name, __tessera_visitor);
        });
        bounds.push(quote!(#ty: #krate::ModuleField));
    }

    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // Generic structs need each visited field type bounded; concrete ones
    // do not, and stay free of bounds that would move errors away from the
    // field.
    let where_clause = if input.generics.params.is_empty() {
        where_clause.to_token_stream()
    } else {
        let existing = where_clause.map(|w| {
            let p = &w.predicates;
            quote!(#p,)
        });
        quote!(where #existing #(#bounds,)*)
    };
    let type_name = match attrs.type_name {
        Some(e) => e.to_token_stream(),
        None => LitStr::new(&ident.to_string(), ident.span()).to_token_stream(),
    };
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Visit for #ident #ty_generics #where_clause {
            #[allow(unused_variables)]
            fn visit<'__tessera_a>(
                &'__tessera_a self,
                __tessera_visitor: &mut dyn #krate::Visitor<'__tessera_a>,
            ) {
                #(#visits)*
            }

            fn type_name(&self) -> &'static str {
                #type_name
            }
        }
    })
}

fn struct_attrs(input: &DeriveInput) -> syn::Result<StructAttrs> {
    let mut out = StructAttrs {
        type_name: None,
        krate: None,
    };
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("type_name") {
                out.type_name = Some(meta.value()?.parse()?);
                Ok(())
            } else if meta.path.is_ident("crate") {
                let value = meta.value()?;
                // Accept `crate = path` and `crate = "path"`.
                out.krate = Some(if value.peek(LitStr) {
                    value.parse::<LitStr>()?.parse()?
                } else {
                    value.parse()?
                });
                Ok(())
            } else {
                Err(meta.error(
                    "unknown module attribute on a struct; expected `type_name = ...` or `crate = ...`",
                ))
            }
        })?;
    }
    Ok(out)
}

fn field_attrs(field: &syn::Field) -> syn::Result<FieldAttrs> {
    let mut out = FieldAttrs::default();
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                out.skip = true;
                Ok(())
            } else if meta.path.is_ident("flatten") {
                out.flatten = true;
                Ok(())
            } else if meta.path.is_ident("rename") {
                out.rename = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown module attribute on a field; expected `skip`, `rename = \"...\"` or `flatten`",
                ))
            }
        })?;
    }
    Ok(out)
}
