//! CREATE (POST on a collection), shared by server-side apply when it creates.

use serde_json::{Value, json};

use super::kinds::prepare_kind;
use super::{CRDS, WriteOpts, check_name, check_namespace, check_type, ctx, for_version, obj_key};
use crate::apply::{self};
use crate::error::ApiError;
use crate::meta::{self, meta_mut, meta_str};
use crate::resources::ResourceDef;
use crate::store::State;

/// CREATE (POST on the collection).
pub fn create(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    mut body: Value,
    w: &WriteOpts,
) -> Result<Value, ApiError> {
    check_type(def, &mut body)?;
    finish_create(st, def, ns, body, w, None)
}

pub(super) fn finish_create(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    mut body: Value,
    w: &WriteOpts,
    applied: Option<&Value>,
) -> Result<Value, ApiError> {
    let mut name = meta_str(&body, "name").to_string();
    if name.is_empty() {
        let gen_name = meta_str(&body, "generateName").to_string();
        if !gen_name.is_empty() {
            name = format!("{gen_name}{}", meta::random_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        }
    }
    check_name(def, &name)?;
    check_namespace(st, def, ns, &mut body, &name)?;
    let ok = obj_key(def, Some(meta_str(&body, "namespace")), &name);
    if st.get(&def.key(), &ok).is_some() {
        return Err(ApiError::already_exists(&def.group, &def.plural, &name));
    }
    let now = meta::now();
    {
        let m = meta_mut(&mut body);
        for k in
            ["uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"]
        {
            m.remove(k);
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(now));
        if def.tracks_generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    if def.has_status && !(def.group.is_empty() && def.plural == "namespaces") {
        // Status is written through /status only; a create starts without one.
        if let Some(m) = body.as_object_mut() {
            m.remove("status");
        }
    }
    crate::schema::admit(st, def, &mut body, None, w.field_validation, &w.warnings)?;
    prepare_kind(st, def, &mut body, true)?;
    let av = def.api_version();
    let c = ctx(def, w, &now, &av, None);
    match applied {
        Some(a) => {
            let with_fields = apply::apply(None, a, w.force, &c)?;
            if let Some(mf) = with_fields["metadata"].get("managedFields") {
                meta_mut(&mut body).insert("managedFields".into(), mf.clone());
            }
        }
        None => apply::track_update(None, &mut body, &c),
    }
    if w.dry_run {
        return Ok(body);
    }
    if def.key() == CRDS {
        st.registry.apply_crd(&body).map_err(ApiError::bad_request)?;
    }
    let stored = st.commit(&def.key(), ok, Some(body), None);
    Ok(for_version(&stored, def))
}
